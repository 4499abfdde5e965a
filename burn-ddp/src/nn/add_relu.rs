//! `relu(a + b)`, the end of a residual block, as one operation that keeps only its output for
//! the backward and masks the incoming gradient in place.
//!
//! Written as `relu(out + identity)`, a residual block's end is an addition and a ReLU: the sum
//! is a tensor of its own, and the ReLU's backward writes its gradient to a new tensor while the
//! incoming one is still alive. With exact-size memory blocks (`kernel_cache::Allocator`) each
//! such tensor that lives beside the others at the backward's peak is one more block of its
//! size: ResNet-50 at batch 256 kept three more activation-sized blocks of each stage's size
//! than it saves for the backward. [`add_relu`] writes `max(a + b, 0)` in one pass and its
//! backward writes `dy · [y > 0]` over `dy` when nothing else holds it; both addends receive
//! that one gradient.

use burn::prelude::*;

/// `max(a + b, 0)`, elementwise. On burn-cuda (with or without autodiff) one kernel pass whose
/// backward keeps only the output (`y > 0` exactly where `a + b > 0`) and overwrites the
/// incoming gradient when it is not shared. Elsewhere, and for operands of different shapes or
/// types, [`super::relu`]`(a + b)`. The sum is taken in f32 and rounded once to the operands'
/// type, as an addition in that type rounds it.
pub fn add_relu<B: Backend, const D: usize>(a: Tensor<B, D>, b: Tensor<B, D>) -> Tensor<B, D> {
    #[cfg(feature = "cuda")]
    let (a, b) = match super::add_relu_cuda::try_add_relu(a, b) {
        Ok(y) => return y,
        Err(operands) => operands,
    };
    super::relu(a + b)
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;

    type B = Autodiff<Flex>;

    /// Against f64 arithmetic: the value, and both addends' gradient of `Σ w·y`.
    #[test]
    fn matches_f64_values_and_gradients() {
        let device = Default::default();
        let (av, bv, wv) = ([-1.5f32, 0.25, 2.0, -0.5, 3.0, -4.0], [1.0f32, -1.0, 0.5, 0.75, -3.5, 1.0], [0.5f32, 2.0, -1.0, 3.0, 1.5, -2.0]);
        let t = |v: [f32; 6]| Tensor::<B, 1>::from_floats(v, &device).reshape([2, 3]);
        let (a, b) = (t(av).require_grad(), t(bv).require_grad());
        let y = add_relu(a.clone(), b.clone());
        let grads = (y.clone() * t(wv)).sum().backward();
        let s: Vec<f64> = av.iter().zip(&bv).map(|(&a, &b)| f64::from(a) + f64::from(b)).collect();
        let expect_y: Vec<f32> = s.iter().map(|&s| s.max(0.0) as f32).collect();
        let expect_g: Vec<f32> = s.iter().zip(&wv).map(|(&s, &w)| if s > 0.0 { w } else { 0.0 }).collect();
        let got = |t: Tensor<Flex, 2>| t.into_data().to_vec::<f32>().expect("f32");
        assert_eq!(got(y.inner()), expect_y);
        assert_eq!(got(a.grad(&grads).expect("a's gradient")), expect_g);
        assert_eq!(got(b.grad(&grads).expect("b's gradient")), expect_g);
    }
}
