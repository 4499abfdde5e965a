//! CUDA kernels (cubecl) of `add_relu` (add_relu_cuda.rs launches them): one elementwise pass
//! each, a thread per vector of up to 16 bytes, arithmetic in f32 whatever the operands' type.

use cubecl::num_traits::Zero;
use cubecl::prelude::*;

/// `y = max(a + b, 0)`, the sum in f32.
#[cube(launch)]
pub(super) fn add_relu_kernel<F: Float, N: Size>(a: &Tensor<Vector<F, N>>, b: &Tensor<Vector<F, N>>, y: &mut Tensor<Vector<F, N>>, vectors: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= vectors as usize {
        terminate!();
    }
    let s = Vector::<f32, N>::cast_from(a[i]) + Vector::<f32, N>::cast_from(b[i]);
    y[i] = Vector::cast_from(select_many(s.less_equal(Vector::zero()), Vector::zero(), s));
}

/// `g = dy` where `y > 0`, else 0.
#[cube(launch)]
pub(super) fn relu_grad_kernel<F: Float, N: Size>(dy: &Tensor<Vector<F, N>>, y: &Tensor<Vector<F, N>>, g: &mut Tensor<Vector<F, N>>, vectors: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= vectors as usize {
        terminate!();
    }
    let d = Vector::<f32, N>::cast_from(dy[i]);
    g[i] = Vector::cast_from(select_many(Vector::<f32, N>::cast_from(y[i]).less_equal(Vector::zero()), Vector::zero(), d));
}

/// `g` zeroed where `y ≤ 0`, in place.
#[cube(launch)]
pub(super) fn relu_grad_in_place_kernel<F: Float, N: Size>(g: &mut Tensor<Vector<F, N>>, y: &Tensor<Vector<F, N>>, vectors: u32, #[define(F)] _dtype: StorageType) {
    let i = ABSOLUTE_POS;
    if i >= vectors as usize {
        terminate!();
    }
    let d = Vector::<f32, N>::cast_from(g[i]);
    g[i] = Vector::cast_from(select_many(Vector::<f32, N>::cast_from(y[i]).less_equal(Vector::zero()), Vector::zero(), d));
}
