//! cuBLAS's matrix products (`matmul`, `linear`) against f64.

use crate::util::{Ad, dtype_name, round, to_f64, values};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cublas;
use burn_ddp::nn::reference::max_rel_err;
use burn_ddp::nn::reference::{gelu_f64, gelu_grad_f64};
use burn_ddp::nn::{linear, linear_gelu, matmul};

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
        let before = cublas::calls();
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
        let used = cublas::calls() - before;
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
