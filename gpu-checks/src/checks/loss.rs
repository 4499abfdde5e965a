//! burn-ddp's cross-entropy kernels against f64.

use crate::util::{Ad, max_abs_err};
use burn::prelude::*;
use burn::tensor::Distribution;
use burn_cuda::{Cuda, CudaDevice};
use burn_ddp::nn::reference::max_rel_err;

/// burn-ddp's fused cross-entropy on the GPU against the f64 loss and gradient computed here
/// (`(softmax − t) / n`), with and without label smoothing, for a ResNet head's shape and odd
/// ones; a label out of range must give NaN, and the kernels must have run.
pub(crate) fn check_cross_entropy(device: &CudaDevice) -> bool {
    use burn_ddp::nn::cross_entropy::{cross_entropy, fused_calls, reference};
    let mut ok = true;
    for (n, k, eps) in [(256usize, 1000usize, 0.0f32), (256, 1000, 0.1), (5, 7, 0.1), (3, 1500, 0.0)] {
        let z: Vec<f32> = Tensor::<Cuda, 1>::random([n * k], Distribution::Normal(0.0, 4.0), device)
            .into_data()
            .into_vec()
            .expect("f32");
        let y: Vec<i64> = (0..n).map(|r| ((r * 7919 + 13) % k) as i64).collect();
        let zt = Tensor::<Ad, 1>::from_floats(z.as_slice(), device).reshape([n, k]).require_grad();
        let yt = Tensor::<Ad, 1, Int>::from_ints(y.iter().map(|&v| v as i32).collect::<Vec<_>>().as_slice(), device);
        let before = fused_calls();
        let loss = cross_entropy(zt.clone(), yt, eps);
        let got: f64 = f64::from(loss.clone().into_scalar().elem::<f32>());
        let grad: Vec<f64> = zt
            .grad(&loss.backward())
            .expect("a gradient")
            .into_data()
            .into_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect();
        let want = reference(&z, &y, k, f64::from(eps));
        let want_grad: Vec<f64> = z
            .chunks(k)
            .zip(&y)
            .flat_map(|(row, &label)| {
                let m = row.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
                let s: f64 = row.iter().map(|&v| (f64::from(v) - m).exp()).sum();
                row.iter()
                    .enumerate()
                    .map(move |(i, &v)| {
                        ((f64::from(v) - m).exp() / s
                            - f64::from(eps) / k as f64
                            - if i as i64 == label { 1.0 - f64::from(eps) } else { 0.0 })
                            / n as f64
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let (loss_err, grad_err) =
            ((got - want).abs() / want.abs().max(1e-12), max_abs_err(&grad, &want_grad) * n as f64);
        let pass = loss_err < 1e-5 && grad_err < 1e-5 && fused_calls() == before + 1;
        println!(
            "RESULT check=cross_entropy n={n} k={k} eps={eps} loss={got:.6} f64={want:.6} rel_err={loss_err:.1e} grad_abs_err_x_n={grad_err:.1e} {}",
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    let z = Tensor::<Ad, 2>::random([4, 10], Distribution::Normal(0.0, 1.0), device);
    let bad: f32 = cross_entropy(z, Tensor::<Ad, 1, Int>::from_ints([1, 2, 10, 3], device), 0.0).into_scalar().elem();
    println!("RESULT check=cross_entropy label_out_of_range loss={bad} {}", if bad.is_nan() { "ok" } else { "FAIL" });
    ok && bad.is_nan()
}

/// `linear::mean_over` (a global average pool on cuBLAS) against f64 means, both axes, and its
/// gradient (each input's is the output's over the axis length).
pub(crate) fn check_mean_over(device: &CudaDevice) -> bool {
    let (n, a, b) = (8usize, 49usize, 2048usize);
    let x: Vec<f32> = Tensor::<Cuda, 1>::random([n * a * b], Distribution::Normal(1.0, 2.0), device)
        .into_data()
        .into_vec()
        .expect("f32");
    let mut ok = true;
    for dim in [1usize, 2] {
        let xt = Tensor::<Ad, 1>::from_floats(x.as_slice(), device).reshape([n, a, b]).require_grad();
        let y = burn_ddp::nn::linear::mean_over(xt.clone(), dim);
        let got: Vec<f64> = y.clone().into_data().into_vec::<f32>().expect("f32").into_iter().map(f64::from).collect();
        let (len, other) = if dim == 1 { (a, b) } else { (b, a) };
        let at = |i: usize, r: usize, o: usize| {
            f64::from(x[if dim == 1 { (i * a + r) * b + o } else { (i * a + o) * b + r }])
        };
        let want: Vec<f64> = (0..n)
            .flat_map(|i| (0..other).map(move |o| (0..len).map(|r| at(i, r, o)).sum::<f64>() / len as f64))
            .collect();
        let grad: Vec<f64> = xt
            .grad(&y.sum().backward())
            .expect("a gradient")
            .into_data()
            .into_vec::<f32>()
            .expect("f32")
            .into_iter()
            .map(f64::from)
            .collect();
        let grad_err = grad.iter().map(|g| (g - 1.0 / len as f64).abs() * len as f64).fold(0.0, f64::max);
        let err = max_rel_err(&got, &want);
        let pass = err < 1e-5 && grad_err < 1e-5;
        println!(
            "RESULT check=mean_over dim={dim} [{n}, {a}, {b}] max_rel_err={err:.1e} grad_rel_err={grad_err:.1e} {}",
            if pass { "ok" } else { "FAIL" }
        );
        ok &= pass;
    }
    ok
}
