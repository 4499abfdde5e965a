//! Matrix products of burn-cuda tensors on cuBLAS, as an autodiff operation whose forward and
//! backward are operations of burn-fusion's stream ([`crate::nn::cuda::runtime::fusion_op`]), ordered with burn's
//! stream on the device like the convolutions ([`launch`]).
//!
//! burn-cuda's own matmul kernels reach about a sixth of cuBLAS's rate on an H200 for a ViT's
//! products (`benches/results/2026-12-01-h200-vit-cublas/`). Operands are read where they lie: a
//! transposed view (`kᵀ` in attention, `Bᵀ` and `Aᵀ` in the backward) becomes cuBLAS's
//! transpose flag, not a copy, and batches whose axes cannot be walked with one stride (q, k, v
//! viewed out of one qkv projection) go to cuBLAS as arrays of addresses; only matrices with
//! gaps inside their rows are packed first. When cuBLAS refuses or fails, burn's kernels run on the same buffers, with
//! one warning per cause.

use crate::error::{Error, Result};
use crate::nn::cuda::cublas;
use crate::nn::cuda::cublas_lt::Epilogue;
use crate::nn::cuda::cudnn::convolution as cudnn;
use crate::nn::cuda::gemm_layout::{Gemm, Operand, batch_offsets, batch_stride, describe, gemm_type};
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{Ad, BURN_RUNS, Inner, Prim, cast, cuda_backend, empty, launch, warn_once};
use burn::prelude::*;
use burn::tensor::TensorPrimitive;
use burn::tensor::ops::FloatTensorOps;
use burn_autodiff::checkpoint::base::Checkpointer;
use burn_autodiff::checkpoint::strategy::NoCheckpointing;
use burn_autodiff::grads::Gradients;
use burn_autodiff::ops::{Backward, Ops, OpsKind};
use burn_cuda::Cuda;

/// Whether `B`'s products run on cuBLAS: burn-cuda (with or without autodiff), the switch on,
/// and libcublas and libcudnn (whose stream and device ordering it shares) loadable.
pub(crate) fn enabled<B: Backend>() -> bool {
    cuda_backend::<B>().is_some()
        && crate::nn::cuda::runtime::launch::path_enabled()
        && crate::nn::settings::options::get().cublas
        && cublas::available()
}

/// `a · b` (batched over equal leading axes) on cuBLAS when [`enabled`] and the tensors suit it
/// (f32, bf16 or f16, one type, rank ≥ 2, equal batch axes); otherwise the inputs come back.
pub(crate) fn try_matmul<B: Backend, const D: usize>(
    a: Tensor<B, D>,
    b: Tensor<B, D>,
) -> std::result::Result<Tensor<B, D>, (Tensor<B, D>, Tensor<B, D>)> {
    if !enabled::<B>() || describe(&a.shape(), &b.shape(), a.dtype(), b.dtype()).is_err() {
        return Err((a, b));
    }
    crate::nn::cuda::runtime::device_thread::check_failure();
    if cuda_backend::<B>() == Some(true) {
        let (aa, ba): (Tensor<Ad, D>, Tensor<Ad, D>) = (cast(a), cast(b));
        return Ok(cast(autodiff_matmul(aa, ba)));
    }
    let (ac, bc): (Tensor<Cuda, D>, Tensor<Cuda, D>) = (cast(a), cast(b));
    let c = forward(ac.into_primitive().tensor(), bc.into_primitive().tensor());
    Ok(cast(Tensor::<Cuda, D>::from_primitive(TensorPrimitive::Float(c))))
}

#[derive(Debug)]
struct CublasMatmul;

/// The forward pass's inputs, for the backward pass.
#[derive(Debug, Clone)]
struct Saved {
    a: Prim,
    b: Prim,
}

impl Backward<Cuda, 2> for CublasMatmul {
    type State = Saved;

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_a, node_b] = ops.parents;
        let dc = grads.consume::<Cuda>(&ops.node);
        let (da, db) = backward(ops.state.a, ops.state.b, dc, node_a.is_some(), node_b.is_some());
        for (node, grad) in [(node_a, da), (node_b, db)] {
            if let (Some(node), Some(grad)) = (node, grad) {
                grads.register::<Cuda>(node.id, grad);
            }
        }
    }
}

fn autodiff_matmul<const D: usize>(a: Tensor<Ad, D>, b: Tensor<Ad, D>) -> Tensor<Ad, D> {
    let (a, b) = (a.into_primitive().tensor(), b.into_primitive().tensor());
    let c = forward(a.primitive.clone(), b.primitive.clone());
    let out = match CublasMatmul.prepare::<NoCheckpointing>([a.node.clone(), b.node.clone()]).compute_bound().stateful()
    {
        OpsKind::Tracked(prep) => prep.finish(Saved { a: a.primitive, b: b.primitive }, c),
        OpsKind::UnTracked(prep) => prep.finish(c),
    };
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// Queues `a · b` (shapes checked by [`describe`]).
fn forward(a: Prim, b: Prim) -> Prim {
    let shape = describe(&a.shape, &b.shape, a.dtype, b.dtype).expect("checked by try_matmul");
    let outputs = [(shape, a.dtype)];
    let mut out = fusion_op::queue("cublas_matmul", vec![a, b], &outputs, move |ins| {
        let [a, b]: [Cube; 2] = ins.try_into().expect("two inputs");
        vec![product(a, false, b, false)]
    });
    out.pop().expect("one output")
}

/// Queues the gradients the graph needs: `da = dc · bᵀ`, `db = aᵀ · dc` (both read in place).
fn backward(a: Prim, b: Prim, dc: Prim, need_a: bool, need_b: bool) -> (Option<Prim>, Option<Prim>) {
    if !need_a && !need_b {
        return (None, None);
    }
    let outputs: Vec<_> = [(need_a, fusion_op::like(&a)), (need_b, fusion_op::like(&b))]
        .into_iter()
        .filter_map(|(need, o)| need.then_some(o))
        .collect();
    let mut out = fusion_op::queue("cublas_matmul_backward", vec![a, b, dc], &outputs, move |ins| {
        let [a, b, dc]: [Cube; 3] = ins.try_into().expect("three inputs");
        let da = need_a.then(|| product(dc.clone(), false, b, true));
        let db = need_b.then(|| product(a, true, dc, false));
        da.into_iter().chain(db).collect()
    })
    .into_iter();
    let da = need_a.then(|| out.next().expect("declared"));
    (da, need_b.then(|| out.next().expect("declared")))
}

/// `y + b` over the rows of `y` (`[m, n]`, `b` `[n]`, one element type) whose backward sums
/// the rows of `dy` on cuBLAS, as the product `ones[1, m] · dy` (burn's column reduction ran at
/// about a sixth of the memory's rate for a ViT's bias gradients), for `Autodiff<Cuda>` tensors
/// when [`enabled`]; otherwise the inputs come back.
pub(crate) fn try_bias_add<B: Backend>(
    y: Tensor<B, 2>,
    b: Tensor<B, 1>,
) -> std::result::Result<Tensor<B, 2>, (Tensor<B, 2>, Tensor<B, 1>)> {
    let suits = y.dtype() == b.dtype() && gemm_type(y.dtype()).is_some() && y.dims()[1] == b.dims()[0];
    if cuda_backend::<B>() != Some(true) || !enabled::<B>() || !suits {
        return Err((y, b));
    }
    let (ya, ba): (Tensor<Ad, 2>, Tensor<Ad, 1>) = (cast(y), cast(b));
    Ok(cast(autodiff_bias_add(ya, ba)))
}

#[derive(Debug)]
struct CublasBiasAdd;

impl Backward<Cuda, 2> for CublasBiasAdd {
    type State = ();

    fn backward(self, ops: Ops<Self::State, 2>, grads: &mut Gradients, _checkpointer: &mut Checkpointer) {
        let [node_y, node_b] = ops.parents;
        let dy = grads.consume::<Cuda>(&ops.node);
        if let Some(node) = node_b {
            grads.register::<Cuda>(node.id, row_sums(dy.clone()));
        }
        if let Some(node) = node_y {
            grads.register::<Cuda>(node.id, dy);
        }
    }
}

fn autodiff_bias_add(y: Tensor<Ad, 2>, b: Tensor<Ad, 1>) -> Tensor<Ad, 2> {
    let (y, b) = (y.into_primitive().tensor(), b.into_primitive().tensor());
    let yc = Tensor::<Cuda, 2>::from_primitive(TensorPrimitive::Float(y.primitive.clone()));
    let bc = Tensor::<Cuda, 1>::from_primitive(TensorPrimitive::Float(b.primitive.clone()));
    let sum = (yc + bc.unsqueeze()).into_primitive().tensor();
    let out = CublasBiasAdd.prepare::<NoCheckpointing>([y.node.clone(), b.node.clone()]).compute_bound().stateless(sum);
    Tensor::from_primitive(TensorPrimitive::Float(out))
}

/// The sums of `dy`'s rows over every axis but the last (`[..., n]` → `[n]`) as
/// `ones[1, m] · dy`, queued on burn's stream.
pub(crate) fn row_sums(dy: Prim) -> Prim {
    let (n, dtype) = (*dy.shape.as_slice().last().expect("a gradient has axes"), dy.dtype);
    let mut out = fusion_op::queue("cublas_row_sums", vec![dy], &[(Shape::new([n]), dtype)], move |ins| {
        let [dy]: [Cube; 1] = ins.try_into().expect("one input");
        vec![row_sums_of(packed(dy))]
    });
    out.pop().expect("one output")
}

/// [`row_sums`] of a packed buffer, on burn-fusion's thread.
pub(crate) fn row_sums_of(dy: Cube) -> Cube {
    let (dims, dtype) = (dy.meta.shape().as_slice().to_vec(), dy.dtype);
    let n = *dims.last().expect("a gradient has axes");
    let m = dims.iter().product::<usize>() / n.max(1);
    let dy = <Inner as FloatTensorOps<Inner>>::float_reshape(dy, Shape::new([m, n]));
    let ones = <Inner as FloatTensorOps<Inner>>::float_ones(Shape::new([1, m]), &dy.device, dtype.into());
    <Inner as FloatTensorOps<Inner>>::float_reshape(product(ones, false, dy, false), Shape::new([n]))
}

/// `op(a) · op(b)`, `op` the transpose of the last two axes where asked, into a new packed
/// buffer: on cuBLAS, or on burn's kernels when cuBLAS cannot.
pub(crate) fn product(a: Cube, ta: bool, b: Cube, tb: bool) -> Cube {
    cublas_product(a.clone(), ta, b.clone(), tb).unwrap_or_else(|e| {
        warn_once("cuBLAS matrix product", &e, BURN_RUNS);
        let t = |x: Cube, yes: bool| {
            let r = x.meta.shape().num_dims();
            if yes { <Inner as FloatTensorOps<Inner>>::float_swap_dims(x, r - 2, r - 1) } else { x }
        };
        <Inner as FloatTensorOps<Inner>>::float_matmul(t(a, ta), t(b, tb))
    })
}

/// `a · b + bias` (`a` `[m, k]`, `b` `[k, n]`, `bias` `[n]`, one element type) into a new
/// packed buffer: the bias added in the product's epilogue on cuBLASLt when
/// `CudnnOptions::lt_epilogue` is on and cuBLASLt takes the shapes, else [`product`] and
/// burn's addition.
pub(crate) fn product_bias(a: Cube, b: Cube, bias: Cube) -> Cube {
    let n = bias.meta.shape().num_elements();
    match epilogue_product(a, false, b, Epilogue::Bias, Some(bias)) {
        Ok((c, _)) => c,
        Err(unused) => {
            let (a, b, bias) = *unused;
            let bias = <Inner as FloatTensorOps<Inner>>::float_reshape(bias.expect("given"), Shape::new([1, n]));
            <Inner as FloatTensorOps<Inner>>::float_add(product(a, false, b, false), bias)
        }
    }
}

/// `(op(a) · b, Σₖ b[k, :])` (`b` `[k, n]`, packed): a linear layer's weight gradient `xᵀ · dy`
/// and its bias gradient, the sums of `dy` over its rows — in one cuBLASLt product when
/// `CudnnOptions::lt_epilogue` is on and cuBLASLt takes the shapes, else [`product`] and
/// [`row_sums_of`].
pub(crate) fn product_and_sums(a: Cube, ta: bool, b: Cube) -> (Cube, Cube) {
    match epilogue_product(a, ta, b, Epilogue::SumsOfB, None) {
        Ok(both) => both,
        Err(unused) => {
            let (a, b, _) = *unused;
            (product(a, ta, b.clone(), false), row_sums_of(b))
        }
    }
}

/// The inputs of [`epilogue_product`], handed back (boxed: three tensors' metadata) when it
/// does not take them.
type Unused = (Cube, Cube, Option<Cube>);

/// `op(a) · b` with `epilogue` on cuBLASLt, and the epilogue's vector (`bias` itself, or the
/// new sums), when the option is on, both operands are single matrices cuBLAS reads as they
/// lie, and cuBLASLt proposes an algorithm; otherwise the inputs come back (`a` and `b`
/// possibly packed) and nothing was queued.
fn epilogue_product(
    a: Cube,
    ta: bool,
    b: Cube,
    epilogue: Epilogue,
    bias: Option<Cube>,
) -> std::result::Result<(Cube, Cube), Box<Unused>> {
    let rank2 = a.meta.shape().num_dims() == 2 && b.meta.shape().num_dims() == 2;
    let dtype = gemm_type(a.dtype).filter(|_| rank2 && b.dtype == a.dtype);
    let (Some(dtype), true) = (dtype, crate::nn::settings::options::get().lt_epilogue) else {
        return Err(Box::new((a, b, bias)));
    };
    let (a, oa, _) = operand(a);
    let (b, ob, _) = operand(b);
    let oa = if ta { oa.t() } else { oa };
    // The output as a new packed buffer will lie: asked about before anything is allocated.
    let (m, n) = (oa.rows, ob.cols);
    let oc = Operand { rows: m, cols: n, row_stride: n, col_stride: 1, batch_stride: 0 };
    let gemm = Gemm { dtype, a: oa, b: ob, c: oc, batch: 1 };
    let device = a.device.index;
    let bias_fits =
        bias.as_ref().is_none_or(|v| v.dtype == a.dtype && v.meta.shape().num_elements() == n && v.is_contiguous());
    if !bias_fits || gemm.validate().is_err() || !cudnn::epilogue_supported(device, &gemm, epilogue) {
        return Err(Box::new((a, b, bias)));
    }
    let c = empty(&a, &[m, n]);
    if operand(c.clone()).1 != oc {
        return Err(Box::new((a, b, bias)));
    }
    let v = bias.unwrap_or_else(|| empty(&b, &[n]));
    // SAFETY: `launch` orders the product after the buffers' producers and before their next
    // users; their extents match `gemm` (read off the buffers themselves) and `v` holds `n`
    // elements of their type; `c`, and `v` when written, are fresh.
    let queued = launch(&[&a, &b, &c, &v], ("gemm_epilogue", gemm, epilogue), move |p, order| unsafe {
        cudnn::with_handle(device, order, |s| s.cublas()?.gemm_epilogue(&gemm, epilogue, [p[0], p[1], p[2], p[3]]))
    });
    match queued {
        Ok(()) => Ok((c, v)),
        Err(e) => {
            warn_once("cuBLASLt product", &e, "the product and the bias's own operation run instead");
            Err(Box::new((a, b, (epilogue == Epilogue::Bias).then_some(v))))
        }
    }
}

fn cublas_product(a: Cube, ta: bool, b: Cube, tb: bool) -> Result<Cube> {
    let dtype = gemm_type(a.dtype)
        .ok_or_else(|| Error::Cudnn { op: "cuBLAS matrix product", reason: format!("{:?} tensors", a.dtype) })?;
    let (a, oa, a_offsets) = operand(a);
    let (b, ob, b_offsets) = operand(b);
    let (oa, ob) = (if ta { oa.t() } else { oa }, if tb { ob.t() } else { ob });
    let mut dims = a.meta.shape().as_slice().to_vec();
    let r = dims.len();
    (dims[r - 2], dims[r - 1]) = (oa.rows, ob.cols);
    let batch = dims[..r - 2].iter().product();
    let c = empty(&a, &dims);
    let (_, oc, _) = operand(c.clone());
    let gemm = Gemm { dtype, a: oa, b: ob, c: oc, batch };
    gemm.validate()?;
    let device = a.device.index;
    if a_offsets.is_none() && b_offsets.is_none() {
        // SAFETY: `launch` orders the product after the buffers' producers and before their
        // next users; their extents match `gemm` (read off the buffers themselves); `c` is fresh.
        launch(&[&a, &b, &c], ("gemm", gemm), move |p, order| unsafe {
            cudnn::with_handle(device, order, |s| s.cublas()?.gemm(&gemm, p[0], p[1], p[2]))
        })?;
        return Ok(c);
    }
    let bytes = a.dtype.size() as u64;
    let offsets =
        |given: Option<Vec<usize>>, stride: usize| given.unwrap_or_else(|| (0..batch).map(|i| i * stride).collect());
    let all =
        [offsets(a_offsets, oa.batch_stride), offsets(b_offsets, ob.batch_stride), offsets(None, oc.batch_stride)];
    // SAFETY: as above, for every matrix: each offset lies inside its buffer (read off its own
    // shape and strides).
    launch(&[&a, &b, &c], ("gemm_pointers", gemm), move |p, order| unsafe {
        let [pa, pb, pc] = [0, 1, 2].map(|i| all[i].iter().map(|&o| p[i] + o as u64 * bytes).collect::<Vec<u64>>());
        cudnn::with_handle(device, order, |s| s.cublas()?.gemm_pointers(&gemm, &pa, &pb, &pc))
    })?;
    Ok(c)
}

/// The buffer as a cuBLAS operand, as it lies when its matrices are row- or column-major (else
/// packed first), and each matrix's element offset when its batch axes cannot be walked with one
/// stride (`None` when they can: the operand's batch stride).
fn operand(t: Cube) -> (Cube, Operand, Option<Vec<usize>>) {
    let (dims, strides) = (t.meta.shape().as_slice().to_vec(), t.meta.strides().to_vec());
    let r = dims.len();
    let o = Operand {
        rows: dims[r - 2],
        cols: dims[r - 1],
        row_stride: strides[r - 2],
        col_stride: strides[r - 1],
        batch_stride: 0,
    };
    if !o.is_readable() {
        let t = packed(t);
        let (t, o, offsets) = operand(t);
        assert!(offsets.is_none(), "a packed buffer's batches are one stride apart");
        return (t, o, None);
    }
    match batch_stride(&dims[..r - 2], &strides[..r - 2]) {
        Some(s) => (t, Operand { batch_stride: s, ..o }, None),
        None => (t, o, Some(batch_offsets(&dims[..r - 2], &strides[..r - 2]))),
    }
}
