//! cuDNN's fused attention against f64.

use crate::util::{Ad, dtype_name, round, to_f64, values};
use burn::prelude::*;
use burn::tensor::FloatDType;
use burn_cuda::CudaDevice;
use burn_ddp::nn::cuda::cudnn::attention as cudnn_sdpa;
use burn_ddp::nn::reference::max_rel_err;
use burn_ddp::nn::{multi_head_self_attention, self_attention};

/// Self-attention in f64 of a qkv buffer `[n, t, 3, h, d]` (values `x`) with output gradient
/// `g` (`[n, t, h, d]`): the output and the qkv gradient, from the textbook formulas
/// (`p = softmax(q·kᵀ/√d)`, `dv = pᵀ·g`, `ds = p ∘ (g·vᵀ − rowsum(g ∘ o))/√d`, `dq = ds·k`,
/// `dk = dsᵀ·q`).
pub(crate) fn attention_f64(x: &[f64], g: &[f64], [n, t, h, d]: [usize; 4]) -> (Vec<f64>, Vec<f64>) {
    let (mut o, mut dx) = (vec![0.0; n * t * h * d], vec![0.0; x.len()]);
    let xi = |b: usize, tok: usize, part: usize, head: usize| (((b * t + tok) * 3 + part) * h + head) * d;
    let oi = |b: usize, tok: usize, head: usize| ((b * t + tok) * h + head) * d;
    let dot = |a: &[f64], b: &[f64]| a.iter().zip(b).map(|(u, v)| u * v).sum::<f64>();
    let scale = 1.0 / (d as f64).sqrt();
    for (b, head) in (0..n).flat_map(|b| (0..h).map(move |hh| (b, hh))) {
        let row = |tok: usize, part: usize| &x[xi(b, tok, part, head)..xi(b, tok, part, head) + d];
        let grad = |tok: usize| &g[oi(b, tok, head)..oi(b, tok, head) + d];
        let p: Vec<Vec<f64>> = (0..t)
            .map(|i| {
                let s: Vec<f64> = (0..t).map(|j| dot(row(i, 0), row(j, 1)) * scale).collect();
                let m = s.iter().cloned().fold(f64::MIN, f64::max);
                let z: f64 = s.iter().map(|v| (v - m).exp()).sum();
                s.iter().map(|v| (v - m).exp() / z).collect()
            })
            .collect();
        for i in 0..t {
            for c in 0..d {
                o[oi(b, i, head) + c] = (0..t).map(|j| p[i][j] * row(j, 2)[c]).sum();
            }
        }
        for i in 0..t {
            let r = dot(grad(i), &o[oi(b, i, head)..oi(b, i, head) + d]);
            let ds: Vec<f64> = (0..t).map(|j| p[i][j] * (dot(grad(i), row(j, 2)) - r) * scale).collect();
            for j in 0..t {
                for c in 0..d {
                    dx[xi(b, i, 0, head) + c] += ds[j] * row(j, 1)[c];
                    dx[xi(b, j, 1, head) + c] += ds[j] * row(i, 0)[c];
                    dx[xi(b, j, 2, head) + c] += p[i][j] * grad(i)[c];
                }
            }
        }
    }
    (o, dx)
}

/// `nn::self_attention` (and `nn::multi_head_self_attention`, the same on the projections'
/// shapes, for head dim 32) on cuDNN's fused flash attention against f64: the output and the qkv
/// gradient (dq, dk, dv in one buffer), bf16 and f16, token counts that are not multiples of a
/// tile (197, 50, 65), head dims 64 and 32; the fused path must have run (two calls per case);
/// f32 (the unfused path: cuBLAS products in strict f32 and a softmax) to 1e-5.
pub(crate) fn check_sdpa(device: &CudaDevice) -> bool {
    let mut ok = true;
    // f32 is not fused (cuDNN's flash attention takes half types): cuBLAS products and a softmax.
    for (dtype, bound) in [(FloatDType::BF16, 2e-2), (FloatDType::F16, 4e-3), (FloatDType::F32, 1e-5)] {
        for dims in [[2, 197, 3, 64], [3, 50, 2, 64], [2, 65, 4, 32]] {
            let [n, t, h, d] = dims;
            let before = cudnn_sdpa::calls();
            let xv =
                round(&values(21, n * t * 3 * h * d, 6.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let gv = round(&values(22, n * t * h * d, 2.0, 0.0).into_iter().map(f64::from).collect::<Vec<_>>(), dtype);
            let x = Tensor::<Ad, 5>::from_data(
                TensorData::new(xv.iter().map(|&a| a as f32).collect::<Vec<_>>(), [n, t, 3, h, d]),
                device,
            )
            .require_grad();
            let g = Tensor::<Ad, 4>::from_data(
                TensorData::new(gv.iter().map(|&a| a as f32).collect::<Vec<_>>(), [n, t, h, d]),
                device,
            );
            // The 5-D layer on the 64-wide heads, the projections' shapes (`[n, t, 3·h·d]` →
            // `[n, t, h·d]`, no views queued) on the others.
            let o = match d {
                64 => self_attention(x.clone().cast(dtype)),
                _ => {
                    multi_head_self_attention(x.clone().cast(dtype).reshape([n, t, 3 * h * d]), h).reshape([n, t, h, d])
                }
            };
            let grads = (o.clone().cast(FloatDType::F32) * g).sum().backward();
            let (o_ref, dx_ref) = attention_f64(&xv, &gv, dims);
            let e = [max_rel_err(&to_f64(o), &o_ref), max_rel_err(&to_f64(x.grad(&grads).expect("dqkv")), &dx_ref)];
            let used = cudnn_sdpa::calls() - before;
            let fused_calls = if dtype == FloatDType::F32 { 0 } else { 2 };
            let pass = used == fused_calls && e.iter().all(|&v| v < bound);
            ok &= pass;
            println!(
                "RESULT check=sdpa_{} shape={dims:?} api={} o={:.1e} dqkv={:.1e} bound={bound:.0e} sdpa_calls={used} {}",
                dtype_name(dtype),
                if d == 64 { "5d" } else { "projections" },
                e[0],
                e[1],
                if pass { "ok" } else { "FAIL" }
            );
        }
    }
    ok
}
