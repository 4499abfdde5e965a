//! The mean cross-entropy of class logits against class labels, with optional label smoothing
//! (`torch.nn.functional.cross_entropy(z, y, label_smoothing=ε)`), as one operation.
//!
//! burn's `CrossEntropyLoss` is a log-softmax (a max and a sum over the classes), a gather and a
//! mean: on burn-cuda, reductions that cubecl autotunes — about 20 kernels compiled and timed on
//! a fresh machine's first step (docs/benchmarks-history.md, 2026-12-03). On burn-cuda (f32 logits)
//! this is one kernel that writes every row's loss and its gradient `(softmax(z) − t) / n`,
//! another that averages the rows, and a backward that scales the saved gradient
//! ([`crate::nn::cuda::ops::cross_entropy`]); elsewhere, burn's `CrossEntropyLoss`.

use burn::prelude::*;
use burn::tensor::Int;

/// `mean_r [logsumexp(z_r) − Σ_i t_ri z_ri]` over the rows of `logits` `[n, k]`, with the targets
/// `t_r = (1 − ε)·onehot(labels_r) + ε/k`: `smoothing` ε in `[0, 1)`. Returns shape `[1]`. A
/// label outside `0..k` makes the loss NaN on burn-cuda; on other backends it is burn-nn's
/// behaviour.
pub fn cross_entropy<B: Backend>(logits: Tensor<B, 2>, labels: Tensor<B, 1, Int>, smoothing: f32) -> Tensor<B, 1> {
    #[cfg(feature = "cuda")]
    let (logits, labels) = match crate::nn::cuda::ops::cross_entropy::try_cross_entropy(logits, labels, smoothing) {
        Ok(loss) => return loss,
        Err(inputs) => inputs,
    };
    let device = logits.device();
    burn_nn::loss::CrossEntropyLossConfig::new()
        .with_smoothing((smoothing > 0.0).then_some(smoothing))
        .init(&device)
        .forward(logits, labels)
}

/// How many losses burn-cuda's kernels have computed in this process (0 without CUDA): whether
/// the fast path ran.
pub fn fused_calls() -> usize {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::ops::cross_entropy::CALLS.load(std::sync::atomic::Ordering::Relaxed);
    #[cfg(not(feature = "cuda"))]
    0
}

/// The same loss in f64 on the host, row by row (the reference the GPU path is checked against).
pub fn reference(logits: &[f32], labels: &[i64], classes: usize, smoothing: f64) -> f64 {
    let rows = logits.chunks(classes).zip(labels).map(|(z, &y)| {
        let m = z.iter().fold(f64::NEG_INFINITY, |m, &v| m.max(f64::from(v)));
        let lse = m + z.iter().map(|&v| (f64::from(v) - m).exp()).sum::<f64>().ln();
        let mean_z = z.iter().map(|&v| f64::from(v)).sum::<f64>() / classes as f64;
        lse - (1.0 - smoothing) * f64::from(z[y as usize]) - smoothing * mean_z
    });
    rows.sum::<f64>() / labels.len() as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;

    type B = Autodiff<Flex>;

    #[test]
    fn the_cpu_path_matches_the_f64_reference_with_and_without_smoothing() {
        let device = Default::default();
        let (n, k) = (5, 7);
        let z: Vec<f32> = (0..n * k).map(|i| ((i * 37 % 23) as f32 - 11.0) * 0.7).collect();
        let y: Vec<i64> = vec![0, 6, 3, 3, 1];
        for eps in [0.0f32, 0.1] {
            let logits = Tensor::<B, 1>::from_floats(z.as_slice(), &device).reshape([n, k]);
            let labels = Tensor::<B, 1, Int>::from_ints(y.as_slice(), &device);
            let got: f32 = cross_entropy(logits, labels, eps).into_scalar().elem();
            let want = reference(&z, &y, k, f64::from(eps));
            assert!((f64::from(got) - want).abs() < 1e-5 * want.abs().max(1.0), "ε {eps}: {got} vs {want}");
        }
    }

    #[test]
    fn the_reference_is_log_k_for_equal_logits() {
        let k = 10;
        let got = reference(&vec![3.0; 2 * k], &[4, 9], k, 0.0);
        assert!((got - (k as f64).ln()).abs() < 1e-12);
    }
}
