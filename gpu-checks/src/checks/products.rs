//! cuBLAS's matrix products (`matmul`, `linear`, the patch embedding) against f64.

use crate::util::{Ad, dtype_name, round, time_ms, to_f64, values};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cublas;
use burn_ddp::nn::reference::{Conv2dCase, conv2d_f64, conv2d_grads_f64, max_rel_err};
use burn_ddp::nn::reference::{gelu_f64, gelu_grad_f64};
use burn_ddp::nn::{Conv2d, Layout, linear, linear_gelu, matmul};

/// Row-major batched product of f64 matrices: `batch` times `[m, k] · [k, n]`.
pub(crate) fn mm(a: &[f64], b: &[f64], batch: usize, m: usize, k: usize, n: usize) -> Vec<f64> {
    let mut c = vec![0.0; batch * m * n];
    for t in 0..batch {
        for i in 0..m {
            for j in 0..n {
                c[(t * m + i) * n + j] = (0..k).map(|l| a[(t * m + i) * k + l] * b[(t * k + l) * n + j]).sum();
            }
        }
    }
    c
}

/// Each `[r, c]` matrix of the batch transposed.
pub(crate) fn tr(a: &[f64], batch: usize, r: usize, c: usize) -> Vec<f64> {
    (0..batch * r * c)
        .map(|o| (o / (r * c), (o % (r * c)) / r, o % r))
        .map(|(t, j, i)| a[(t * r + i) * c + j])
        .collect()
}

pub(crate) fn leaf<const D: usize>(
    device: &CudaDevice,
    seed: u64,
    dims: [usize; D],
    dtype: FloatDType,
) -> (Tensor<Ad, D>, Vec<f64>) {
    let v = round(&values(seed, dims.iter().product(), 1.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
    let t = Tensor::<Ad, D>::from_data(TensorData::new(v.iter().map(|&a| a as f32).collect::<Vec<_>>(), dims), device)
        .require_grad();
    (t, v)
}

/// `nn::linear` and `nn::matmul` on cuBLAS against f64: a linear layer of odd sizes with bias
/// (its gradient: row sums on cuBLAS), on a 2-D and a 3-D input (one operation each way), and attention's `q · kᵀ` with
/// `q` a sliced, permuted view (batch axes not one stride apart: an array of addresses, at an
/// offset into its buffer) and `kᵀ` a transposed view
/// (read in place); values and all gradients.
pub(crate) fn check_gemm(device: &CudaDevice) -> bool {
    let mut ok = true;
    for (dtype, bound) in [(FloatDType::F32, 1e-5), (FloatDType::BF16, 1e-2), (FloatDType::F16, 2e-3)] {
        let (before, merged_before) = (cublas::calls(), burn_ddp::nn::cuda::cublas_lt::calls()[1]);
        let (x, xv) = leaf(device, 1, [37, 70], dtype);
        let (g, gv) = leaf(device, 3, [37, 19], dtype);
        let layer = burn_nn::LinearConfig::new(70, 19).init::<Ad>(device);
        let (wv, bv) = (
            round(&to_f64(layer.weight.val()), dtype),
            round(&to_f64(layer.bias.as_ref().expect("bias").val()), dtype),
        );
        let y_ref: Vec<f64> = mm(&xv, &wv, 1, 37, 70, 19).iter().enumerate().map(|(i, v)| v + bv[i % 19]).collect();
        let db_ref: Vec<f64> = (0..19).map(|j| (0..37).map(|i| gv[i * 19 + j]).sum()).collect();
        // As `[37, 70]` and as `[37, 1, 70]` (a transformer's `[batch, tokens, features]`).
        let e2: Vec<f64> = [false, true]
            .into_iter()
            .flat_map(|rank3| {
                let y = if rank3 {
                    linear(&layer, x.clone().cast(dtype).reshape([37, 1, 70])).reshape([37, 19])
                } else {
                    linear(&layer, x.clone().cast(dtype))
                };
                let grads = (y.clone().cast(FloatDType::F32) * g.clone().detach()).sum().backward();
                let dw = layer.weight.grad(&grads).expect("dw");
                [
                    max_rel_err(&to_f64(y), &y_ref),
                    max_rel_err(&to_f64(x.grad(&grads).expect("dx")), &mm(&gv, &tr(&wv, 1, 70, 19), 1, 37, 19, 70)),
                    max_rel_err(&to_f64(dw), &mm(&tr(&xv, 1, 37, 70), &gv, 1, 70, 37, 19)),
                    max_rel_err(&to_f64(layer.bias.as_ref().expect("bias").grad(&grads).expect("db")), &db_ref),
                ]
            })
            .collect();
        // `linear_gelu` on `[37, 1, 70]`: one product each way, then the bias + GELU kernel.
        let h = linear_gelu(&layer, x.clone().cast(dtype).reshape([37, 1, 70])).reshape([37, 19]);
        let grads = (h.clone().cast(FloatDType::F32) * g.clone().detach()).sum().backward();
        let dz: Vec<f64> = y_ref.iter().zip(&gv).map(|(&y, g)| g * gelu_grad_f64(y)).collect();
        let e4 = [
            max_rel_err(&to_f64(h), &y_ref.iter().map(|&y| gelu_f64(y)).collect::<Vec<_>>()),
            max_rel_err(&to_f64(x.grad(&grads).expect("dx")), &mm(&dz, &tr(&wv, 1, 70, 19), 1, 37, 19, 70)),
            max_rel_err(&to_f64(layer.weight.grad(&grads).expect("dw")), &mm(&tr(&xv, 1, 37, 70), &dz, 1, 70, 37, 19)),
        ];
        let (p, _) = leaf(device, 4, [2, 29, 2, 3, 8], dtype);
        let (k, kv) = leaf(device, 5, [2, 3, 29, 8], dtype);
        let (g, gv) = leaf(device, 6, [2, 3, 29, 29], dtype);
        // As a ViT's q out of its qkv projection: part 1 of [n, t, parts, h, d], viewed [n, h, t, d].
        let part = |t: Tensor<Ad, 5>| t.permute([2, 0, 3, 1, 4]).slice([1..2]).reshape([2, 3, 29, 8]);
        let q = part(p.clone().cast(dtype));
        let qv = to_f64(q.clone());
        let s = matmul(q, k.clone().cast(dtype).swap_dims(2, 3));
        let grads = (s.clone().cast(FloatDType::F32) * g.detach()).sum().backward();
        let dq = mm(&gv, &kv, 6, 29, 29, 8);
        let dp = part(Tensor::from_inner(p.grad(&grads).expect("dp")));
        let e3 = [
            max_rel_err(&to_f64(s), &mm(&qv, &tr(&kv, 6, 29, 8), 6, 29, 8, 29)),
            max_rel_err(&to_f64(dp), &dq),
            max_rel_err(&to_f64(k.grad(&grads).expect("dk")), &mm(&tr(&gv, 6, 29, 29), &qv, 6, 29, 29, 8)),
        ];
        // A weight gradient with its bias's in cuBLASLt's epilogue (BURN_DDP_LT_EPILOGUE=1) is
        // one product, not two.
        let used = cublas::calls() - before + (burn_ddp::nn::cuda::cublas_lt::calls()[1] - merged_before);
        // linear, twice: forward, dx, dw, db (row sums); linear_gelu: forward, dx, dw, db;
        // attention: forward, dq, dk.
        let pass = used == 15 && e2.iter().chain(&e3).chain(&e4).all(|&e| e < bound);
        ok &= pass;
        let f = |e: &[f64]| e.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/");
        println!(
            "RESULT check=cublas_{} linear(y/dx/dw/db, 2-D then 3-D)={} linear_gelu(h/dx/dw)={} attention(s/dq/dk)={} bound={bound:.0e} cublas_calls={used} {}",
            dtype_name(dtype),
            f(&e2),
            f(&e4),
            f(&e3),
            if pass { "ok" } else { "FAIL" }
        );
    }
    ok
}

/// A patch embedding (`nn::Conv2d::forward_tokens`, ViT's) as one product on cuBLAS against
/// the f64 convolution: the tokens and the gradients of the image, filter and bias, in f32 and
/// bf16, in both layouts, on an image with rows and columns past the last whole patch; the
/// product must have run (four cuBLAS calls: the tokens, the image's, the filter's and the
/// bias's gradients). Then ViT-B/16's own patch embedding (bf16, batch 128, 224², no
/// gradient for the image) forward and backward, timed by the product and by cuDNN's
/// convolution: printed, not judged.
pub(crate) fn check_patch_embed(device: &CudaDevice) -> bool {
    let case = Conv2dCase::patches(3, [50, 40], 24, [16, 16], true);
    let (x, w, b, g) = case.random_inputs(21);
    let mut ok = true;
    for (dtype, bound) in [(FloatDType::F32, 1e-5), (FloatDType::BF16, 1e-2)] {
        let (x, w, b, g) = (round(&x, dtype), round(&w, dtype), round(&b, dtype), round(&g, dtype));
        let want = patch_embed_reference(&case, &x, &w, &b, &g);
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let (before, merged_before) = (cublas::calls(), burn_ddp::nn::cuda::cublas_lt::calls()[1]);
            let got = patch_embed_on_gpu(device, &case, (&x, &w, &b, &g), dtype, layout);
            // As `products` counts them: a weight and bias gradient from one product count two.
            let used = cublas::calls() - before + (burn_ddp::nn::cuda::cublas_lt::calls()[1] - merged_before);
            let errs: Vec<f64> = got.iter().zip(&want).map(|(g, w)| max_rel_err(g, w)).collect();
            let pass = used == 4 && errs.iter().all(|&e| e < bound);
            ok &= pass;
            println!(
                "RESULT check=patch_embed_{} layout={layout:?} tokens/dx/dw/db={} bound={bound:.0e} cublas_calls={used} {}",
                dtype_name(dtype),
                errs.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/"),
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    time_vit_patch_embed(device);
    ok
}

/// The f64 tokens `[n, grid, k]` and the gradients of the image, filter and bias under
/// `Σ tokens · g` (`g` in the convolution's output order).
fn patch_embed_reference(case: &Conv2dCase, x: &[f64], w: &[f64], b: &[f64], g: &[f64]) -> [Vec<f64>; 4] {
    let [gh, gw] = case.out_hw();
    let (cells, k) = (gh * gw, case.k);
    let y = conv2d_f64(case, x, w, b);
    let tokens = (0..case.n * cells * k).map(|i| y[(i / (cells * k) * k + i % k) * cells + i / k % cells]).collect();
    let (dx, dw, db) = conv2d_grads_f64(case, x, w, g);
    [tokens, dx, dw, db]
}

/// The tokens and the gradients of the image, filter and bias of `forward_tokens` on the GPU
/// (the image cast to `dtype` in `layout`; the parameters f32).
fn patch_embed_on_gpu(
    device: &CudaDevice,
    case: &Conv2dCase,
    (x, w, b, g): (&[f64], &[f64], &[f64], &[f64]),
    dtype: FloatDType,
    layout: Layout,
) -> [Vec<f64>; 4] {
    use burn::module::Param;
    let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
    let [gh, gw] = case.out_hw();
    let layer = Conv2d {
        weight: Param::from_tensor(Tensor::<Ad, 4>::from_data(TensorData::new(f32s(w), case.w_dims()), device)),
        bias: Some(Param::from_tensor(Tensor::<Ad, 1>::from_data(TensorData::new(f32s(b), [case.k]), device))),
        stride: case.stride,
        kernel_size: [case.r, case.s],
        dilation: [1, 1],
        groups: 1,
        padding: burn_nn::PaddingConfig2d::Valid,
        layout,
        precision: None,
    };
    let xt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(x), case.x_dims()), device).require_grad();
    let gt = Tensor::<Ad, 4>::from_data(TensorData::new(f32s(g), case.y_dims()), device)
        .reshape([case.n, case.k, gh * gw])
        .swap_dims(1, 2);
    let (tokens, grid) = layer.forward_tokens(layout.view_from_nchw(xt.clone()).cast(dtype));
    assert_eq!(grid, [gh, gw], "the patch grid");
    let grads = (tokens.clone().cast(FloatDType::F32) * gt).sum().backward();
    let bias = layer.bias.as_ref().expect("bias");
    [
        to_f64(tokens),
        to_f64(xt.grad(&grads).expect("the image's gradient")),
        to_f64(layer.weight.val().grad(&grads).expect("the filter's gradient")),
        to_f64(bias.val().grad(&grads).expect("the bias's gradient")),
    ]
}

/// ViT-B/16's patch embedding, bf16 b128 224², forward and backward, by the product and by the
/// convolution (`CudnnOptions::patch_gemm` off): one line of milliseconds.
fn time_vit_patch_embed(device: &CudaDevice) {
    use burn_ddp::nn::options::{self, CudnnOptions};
    let layer: Conv2d<Ad> =
        burn_nn::conv::Conv2dConfig::new([3, 768], [16, 16]).with_stride([16, 16]).init::<Ad>(device).into();
    let x = Tensor::<Ad, 4>::random([128, 3, 224, 224], burn::tensor::Distribution::Normal(0.0, 1.0), device)
        .cast(FloatDType::BF16);
    let base = options::get();
    let mut ms = [0.0; 2];
    for (i, product) in [true, false].into_iter().enumerate() {
        options::set(CudnnOptions { patch_gemm: product, ..base.clone() });
        ms[i] = time_ms(10, device, || {
            let (tokens, _) = layer.forward_tokens(x.clone());
            let _ = tokens.cast(FloatDType::F32).sum().backward();
        });
    }
    options::set(base);
    println!(
        "RESULT check=patch_embed_timing vit_b16_bf16_b128 product_ms={:.3} convolution_ms={:.3} (forward + backward; printed, not judged)",
        ms[0], ms[1]
    );
}

/// `nn::linear` with its bias in cuBLASLt's epilogue and the bias's gradient computed by the
/// weight gradient's product (`CudnnOptions::lt_epilogue`, on by default), and with both
/// separate (the path for products cuBLASLt refuses), against f64, in f32, bf16 and f16, on odd
/// sizes and on ViT-B/16's qkv projection (`[128·197, 768] → 2304`): the output and the
/// gradients of the input, weight and bias. It passes when every value is within bound and the
/// bias epilogue ran exactly when it was on; how many bias gradients came from the epilogue
/// (cuBLASLt may refuse that one, and the separate sum runs) is printed.
pub(crate) fn check_linear_epilogue(device: &CudaDevice) -> bool {
    use burn_ddp::nn::cuda::cublas_lt;
    use burn_ddp::nn::options::{self, CudnnOptions};
    let base = options::get();
    let mut ok = true;
    for epilogue in [true, false] {
        options::set(CudnnOptions { lt_epilogue: epilogue, ..base.clone() });
        for (dtype, bound) in [(FloatDType::F32, 1e-5), (FloatDType::BF16, 1e-2), (FloatDType::F16, 2e-3)] {
            // ViT-B/16's qkv projection in the half types (f32's bound is for short sums).
            let large = (dtype != FloatDType::F32).then_some((128 * 197, 768, 2304));
            for (rows, d_in, d_out) in std::iter::once((37, 72, 24)).chain(large) {
                let before = cublas_lt::calls();
                let errs = linear_against_f64(device, dtype, rows, d_in, d_out);
                let after = cublas_lt::calls();
                let (bias_calls, sums_calls) = (after[0] - before[0], after[1] - before[1]);
                let pass = bias_calls == u64::from(epilogue) && errs.iter().all(|&e| e < bound);
                ok &= pass;
                println!(
                    "RESULT check=linear_{}_{} rows={rows} d_in={d_in} d_out={d_out} y/dx/dw/db={} bound={bound:.0e} bias_epilogues={bias_calls} bias_gradient_epilogues={sums_calls} {}",
                    if epilogue { "epilogue" } else { "separate" },
                    dtype_name(dtype),
                    errs.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/"),
                    if pass { "ok" } else { "FAIL" }
                );
            }
        }
    }
    options::set(base);
    ok
}

/// Relative errors of `nn::linear`'s output and of the gradients of its input, weight and bias
/// under `Σ y · g`, against f64 from the values as the GPU holds them. Large sizes compare a
/// sample of rows of `y` and `dx` and a grid of `dw`'s elements (the whole f64 products would
/// take minutes on the host); `db` whole.
fn linear_against_f64(device: &CudaDevice, dtype: FloatDType, rows: usize, d_in: usize, d_out: usize) -> [f64; 4] {
    let (x, xv) = leaf(device, 7, [rows, d_in], dtype);
    let (g, gv) = leaf(device, 8, [rows, d_out], dtype);
    let layer = burn_nn::LinearConfig::new(d_in, d_out).init::<Ad>(device);
    let weight = layer.weight.val();
    let bias = layer.bias.as_ref().expect("bias").val();
    let (wv, bv) = (round(&to_f64(weight.clone()), dtype), round(&to_f64(bias.clone()), dtype));
    let y = linear(&layer, x.clone().cast(dtype));
    let grads = (y.clone().cast(FloatDType::F32) * g.clone().detach()).sum().backward();
    let (yv, dx) = (to_f64(y), to_f64(x.grad(&grads).expect("dx")));
    let dw = to_f64(layer.weight.grad(&grads).expect("dw"));
    let db = to_f64(layer.bias.as_ref().expect("bias").grad(&grads).expect("db"));
    // A sample of rows for y and dx (every row for small sizes); dw and db sum every row.
    let step = (rows / 64).max(1);
    let sample: Vec<usize> = (0..rows).step_by(step).collect();
    let pick =
        |v: &[f64], cols: usize| sample.iter().flat_map(|&r| v[r * cols..(r + 1) * cols].to_vec()).collect::<Vec<_>>();
    let (xs, gs) = (pick(&xv, d_in), pick(&gv, d_out));
    let y_ref: Vec<f64> =
        mm(&xs, &wv, 1, sample.len(), d_in, d_out).iter().enumerate().map(|(i, v)| v + bv[i % d_out]).collect();
    let dx_ref = mm(&gs, &tr(&wv, 1, d_in, d_out), 1, sample.len(), d_out, d_in);
    // dw at a grid of (input, output) positions, each summed over every row.
    let cells: Vec<(usize, usize)> = (0..d_in)
        .step_by((d_in / 48).max(1))
        .flat_map(|i| (0..d_out).step_by((d_out / 48).max(1)).map(move |j| (i, j)))
        .collect();
    let dw_ref: Vec<f64> =
        cells.iter().map(|&(i, j)| (0..rows).map(|r| xv[r * d_in + i] * gv[r * d_out + j]).sum()).collect();
    let dw_got: Vec<f64> = cells.iter().map(|&(i, j)| dw[i * d_out + j]).collect();
    let db_ref: Vec<f64> = (0..d_out).map(|j| (0..rows).map(|i| gv[i * d_out + j]).sum()).collect();
    [
        max_rel_err(&pick(&yv, d_out), &y_ref),
        max_rel_err(&pick(&dx, d_in), &dx_ref),
        max_rel_err(&dw_got, &dw_ref),
        max_rel_err(&db, &db_ref),
    ]
}
