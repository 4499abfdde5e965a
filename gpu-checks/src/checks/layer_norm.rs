//! The layer norm (cuDNN's, and our forward kernel with cuDNN's backward) against f64.

use crate::util::{Ad, dtype_name, round, to_f64, values};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cudnn::layer_norm as cudnn_ln;
use burn_ddp::nn::layer_norm;
use burn_ddp::nn::reference::max_rel_err;

/// `nn::layer_norm` against f64: y, dx, dγ, dβ of `[batch, rows, features]` (odd row counts;
/// 96, 768 and 384 features — 384 bf16/f16 features are rows of 768 bytes, which burn-cuda pads
/// to 1,024, so that case's input is not packed), bf16 and f16 activations, f32 γ/β; on cuDNN
/// both ways (two cuDNN calls per case), then with `layer_norm_kernel` (our forward kernel, one
/// cuDNN call).
pub(crate) fn check_ln(device: &CudaDevice) -> bool {
    use burn_ddp::nn::options::{self, CudnnOptions};
    let base = options::get();
    let mut ok = true;
    for ours in [false, true] {
        options::set(CudnnOptions { layer_norm_kernel: ours, ..base.clone() });
        ok &= check_ln_cases(device, ours);
    }
    options::set(base);
    ok
}

fn check_ln_cases(device: &CudaDevice, ours: bool) -> bool {
    let mut ok = true;
    for (dtype, bound) in [(FloatDType::BF16, 2e-2), (FloatDType::F16, 4e-3)] {
        for [batch, per, f] in [[1, 37, 96], [1, 197, 768], [3, 67, 384]] {
            let rows = batch * per;
            let (before, kernel_before) = (cudnn_ln::calls(), burn_ddp::nn::layer_norm::kernel_forward_calls());
            let xv = round(&values(31, rows * f, 6.0, 1.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let gv = round(&values(32, rows * f, 2.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let (gamma, beta): (Vec<f64>, Vec<f64>) = (
                values(33, f, 2.0, 1.0).into_iter().map(f64::from).collect(),
                values(34, f, 1.0, 0.0).into_iter().map(f64::from).collect(),
            );
            let mut norm = burn_nn::LayerNormConfig::new(f).with_epsilon(1e-6).init::<Ad>(device);
            let f32s = |v: &[f64]| v.iter().map(|&a| a as f32).collect::<Vec<_>>();
            norm.gamma =
                norm.gamma.map(|_| Tensor::from_data(TensorData::new(f32s(&gamma), [f]), device).require_grad());
            norm.beta = norm
                .beta
                .map(|b| b.map(|_| Tensor::from_data(TensorData::new(f32s(&beta), [f]), device).require_grad()));
            let x = Tensor::<Ad, 3>::from_data(TensorData::new(f32s(&xv), [batch, per, f]), device).require_grad();
            let g = Tensor::<Ad, 3>::from_data(TensorData::new(f32s(&gv), [batch, per, f]), device);
            let y = layer_norm(&norm, x.clone().cast(dtype), 1e-6);
            let grads = (y.clone().cast(FloatDType::F32) * g).sum().backward();
            let (mut y_ref, mut dx_ref, mut dg_ref, mut db_ref) =
                (vec![0.0; rows * f], vec![0.0; rows * f], vec![0.0; f], vec![0.0; f]);
            for r in 0..rows {
                let row = &xv[r * f..(r + 1) * f];
                let mean = row.iter().sum::<f64>() / f as f64;
                let rstd = 1.0 / (row.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / f as f64 + 1e-6).sqrt();
                let xhat: Vec<f64> = row.iter().map(|v| (v - mean) * rstd).collect();
                let dxhat: Vec<f64> = (0..f).map(|i| gv[r * f + i] * gamma[i]).collect();
                let (m1, m2) = (
                    dxhat.iter().sum::<f64>() / f as f64,
                    dxhat.iter().zip(&xhat).map(|(a, b)| a * b).sum::<f64>() / f as f64,
                );
                for i in 0..f {
                    y_ref[r * f + i] = xhat[i] * gamma[i] + beta[i];
                    dx_ref[r * f + i] = rstd * (dxhat[i] - m1 - xhat[i] * m2);
                    dg_ref[i] += gv[r * f + i] * xhat[i];
                    db_ref[i] += gv[r * f + i];
                }
            }
            let e = [
                max_rel_err(&to_f64(y), &y_ref),
                max_rel_err(&to_f64(x.grad(&grads).expect("dx")), &dx_ref),
                max_rel_err(&to_f64(norm.gamma.grad(&grads).expect("dgamma")), &dg_ref),
                max_rel_err(&to_f64(norm.beta.as_ref().expect("beta").grad(&grads).expect("dbeta")), &db_ref),
            ];
            let used = cudnn_ln::calls() - before;
            let kernel = burn_ddp::nn::layer_norm::kernel_forward_calls() - kernel_before;
            let pass = (used, kernel) == if ours { (1, 1) } else { (2, 0) } && e.iter().all(|&v| v < bound);
            ok &= pass;
            let list = e.iter().map(|v| format!("{v:.1e}")).collect::<Vec<_>>().join("/");
            println!(
                "RESULT check=layer_norm_{}{} batch={batch} rows={per} features={f} y/dx/dgamma/dbeta={list} bound={bound:.0e} cudnn_ln_calls={used} kernel_forward_calls={kernel} {}",
                dtype_name(dtype),
                if ours { "_kernel_forward" } else { "" },
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    ok
}
