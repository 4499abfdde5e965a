//! Helpers every check shares: tensors to f64, rounding to a type, seeded values, timing.

use burn::prelude::*;
use burn::tensor::{FloatDType, bf16, f16};
use burn_autodiff::Autodiff;
use burn_cuda::{Cuda, CudaDevice};
use std::time::Instant;

pub(crate) type Ad = Autodiff<Cuda>;

pub(crate) fn to_f64<const D: usize, B: Backend>(t: Tensor<B, D>) -> Vec<f64> {
    t.cast(FloatDType::F32).into_data().to_vec::<f32>().expect("f32 data").into_iter().map(f64::from).collect()
}

/// `v` rounded to `dtype` (so that a reference computed from the result sees exactly what the
/// GPU sees).
pub(crate) fn round(v: &[f64], dtype: FloatDType) -> Vec<f64> {
    match dtype {
        FloatDType::BF16 => v.iter().map(|&a| bf16::from_f64(a).to_f64()).collect(),
        FloatDType::F16 => v.iter().map(|&a| f16::from_f64(a).to_f64()).collect(),
        _ => v.to_vec(),
    }
}

/// Seeded values in `shift ± scale/2` (the seeded generator the f64 reference uses).
pub(crate) fn values(seed: u64, len: usize, scale: f32, shift: f32) -> Vec<f32> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    (0..len).map(|_| shift + scale * rng.random_range(-0.5f32..0.5)).collect()
}

pub(crate) fn time_ms(iters: usize, device: &CudaDevice, mut f: impl FnMut()) -> f64 {
    f();
    f();
    <Cuda as Backend>::sync(device).expect("sync");
    let t = Instant::now();
    for _ in 0..iters {
        f();
    }
    <Cuda as Backend>::sync(device).expect("sync");
    t.elapsed().as_secs_f64() * 1e3 / iters as f64
}

pub(crate) fn dtype_name(dtype: FloatDType) -> &'static str {
    match dtype {
        FloatDType::BF16 => "bf16",
        FloatDType::F16 => "f16",
        _ => "f32",
    }
}

pub(crate) fn max_abs_err(a: &[f64], b: &[f64]) -> f64 {
    a.iter().zip(b).map(|(x, y)| (x - y).abs()).fold(0.0, f64::max)
}
