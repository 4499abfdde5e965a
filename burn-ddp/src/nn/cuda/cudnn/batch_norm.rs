//! cuDNN batch normalization over (N, H, W) per channel — training forward, backward, inference
//! — with an optional ReLU after it, on raw device pointers of packed NCHW tensors: activations
//! in f32, bf16 or f16, parameters and statistics in f32 (cuDNN computes in f32 throughout).
//!
//! The saved statistics are cuDNN's: the batch mean and `1 / sqrt(biased variance + eps)`.
//! Running statistics are left to the caller (burn's BatchNorm blends the *biased* variance,
//! PyTorch the unbiased one; the caller keeps burn's rule).

use crate::error::Result;
use crate::nn::cuda::cudnn::convolution::{
    DataType, Order, TensorDesc, fail, packed, relu_desc, tensor_desc, with_handle,
};
use cudarc::cudnn::sys;
use std::ffi::c_void;
use sys::cudnnHandle_t as Handle;

/// cuDNN refuses a smaller epsilon (`CUDNN_BN_MIN_EPSILON`).
pub const MIN_EPSILON: f64 = 1e-5;

const SPATIAL: sys::cudnnBatchNormMode_t = sys::cudnnBatchNormMode_t::CUDNN_BATCHNORM_SPATIAL;

/// The activation descriptor (packed `dims` of `dt`) and the per-channel one (`[1, c, 1, 1]`,
/// always f32).
fn descriptors(dt: DataType, dims: [i32; 4]) -> Result<(TensorDesc, TensorDesc)> {
    Ok((tensor_desc(dt, dims, packed(dims))?, tensor_desc(DataType::F32, [1, dims[1], 1, 1], [dims[1], 1, 1, 1])?))
}

/// cuDNN's `alpha = 1, beta = 0` (overwrite the output), as the pointers it takes.
const ONE: f32 = 1.0;
const ZERO: f32 = 0.0;
fn scale(v: &'static f32) -> *const c_void {
    v as *const f32 as *const c_void
}

/// `y = relu(y)` in place (cuDNN allows in-place activations).
///
/// # Safety
/// `y` holds `xd`'s extent of live device memory.
unsafe fn relu_in_place(h: Handle, xd: &TensorDesc, y: u64) -> Result<()> {
    let act = relu_desc()?;
    // SAFETY: as this function's contract.
    unsafe { sys::cudnnActivationForward(h, act.0, scale(&ONE), xd.0, ptr(y), scale(&ZERO), xd.0, ptr(y)) }
        .result()
        .map_err(|e| fail("cudnnActivationForward", e))
}

fn ptr(p: u64) -> *mut c_void {
    p as *mut c_void
}

/// Training forward: `y = gamma * (x - mean) * inv_std + beta`, then ReLU when `relu`, with
/// the batch statistics written to `save_mean` and `save_inv_std` (`c` values each).
/// Pointers, in order: x, y, gamma, beta, save_mean, save_inv_std.
///
/// # Safety
/// Live device memory of `device`: x and y hold `dims` packed elements of `dt`, the rest
/// `dims[1]` f32;
/// untouched by others until the computation has finished (see [`Order`]).
pub unsafe fn forward_training(
    device: usize,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 6],
    order: Order,
) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe { with_handle(device, order, |s| forward_training_in(s.raw(), dt, dims, eps, relu, p)) }
}

/// [`forward_training`] enqueued with a handle already in use (inside `with_handle`).
///
/// # Safety
/// As [`forward_training`].
pub(crate) unsafe fn forward_training_in(
    h: Handle,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 6],
) -> Result<()> {
    let [x, y, gamma, beta, mean, inv_std] = p;
    let (a, b) = (scale(&ONE), scale(&ZERO));
    // SAFETY: descriptors match the extents the caller guarantees.
    unsafe {
        forward_then_relu(h, dt, dims, relu, y, "cudnnBatchNormalizationForwardTraining", |xd, cd| {
            sys::cudnnBatchNormalizationForwardTraining(
                h,
                SPATIAL,
                a,
                b,
                xd,
                ptr(x),
                xd,
                ptr(y),
                cd,
                ptr(gamma),
                ptr(beta),
                0.0,
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                eps,
                ptr(mean),
                ptr(inv_std),
            )
        })
    }
}

/// Runs one batch-norm forward `call` (given the activation and per-channel descriptors of
/// `dims`), then ReLU in place on `y` when `relu`.
///
/// # Safety
/// `call` must be a cuDNN call whose pointers match the descriptors; `y` as in
/// [`relu_in_place`].
unsafe fn forward_then_relu(
    h: Handle,
    dt: DataType,
    dims: [i32; 4],
    relu: bool,
    y: u64,
    what: &'static str,
    call: impl FnOnce(sys::cudnnTensorDescriptor_t, sys::cudnnTensorDescriptor_t) -> sys::cudnnStatus_t,
) -> Result<()> {
    let (xd, cd) = descriptors(dt, dims)?;
    call(xd.0, cd.0).result().map_err(|e| fail(what, e))?;
    if relu {
        // SAFETY: as this function's contract.
        unsafe { relu_in_place(h, &xd, y)? };
    }
    Ok(())
}

/// Inference forward with the running statistics, then ReLU when `relu`.
/// Pointers, in order: x, y, gamma, beta, running_mean, running_var.
///
/// # Safety
/// As [`forward_training`].
pub unsafe fn forward_inference(
    device: usize,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 6],
    order: Order,
) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe { with_handle(device, order, |s| forward_inference_in(s.raw(), dt, dims, eps, relu, p)) }
}

unsafe fn forward_inference_in(
    h: Handle,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 6],
) -> Result<()> {
    let [x, y, gamma, beta, mean, var] = p;
    let (a, b) = (scale(&ONE), scale(&ZERO));
    // SAFETY: as `forward_training`.
    unsafe {
        forward_then_relu(h, dt, dims, relu, y, "cudnnBatchNormalizationForwardInference", |xd, cd| {
            sys::cudnnBatchNormalizationForwardInference(
                h,
                SPATIAL,
                a,
                b,
                xd,
                ptr(x),
                xd,
                ptr(y),
                cd,
                ptr(gamma),
                ptr(beta),
                ptr(mean),
                ptr(var),
                eps,
            )
        })
    }
}

/// Gradients of [`forward_training`]. With `relu`, `dy` is first masked by `y > 0` into
/// `dz` (scratch of x's size); without, `dz` is unused (pass 0).
/// Pointers, in order: x, y, dy, dz, dx, gamma, dgamma, dbeta, save_mean, save_inv_std.
///
/// # Safety
/// As [`forward_training`]; dy, dz, dx hold `dims` packed elements of `dt`.
pub unsafe fn backward(
    device: usize,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 10],
    order: Order,
) -> Result<()> {
    // SAFETY: as this function's contract.
    unsafe { with_handle(device, order, |s| backward_in(s.raw(), dt, dims, eps, relu, p)) }
}

/// [`backward`] enqueued with a handle already in use (inside `with_handle`).
///
/// # Safety
/// As [`backward`].
pub(crate) unsafe fn backward_in(
    h: Handle,
    dt: DataType,
    dims: [i32; 4],
    eps: f64,
    relu: bool,
    p: [u64; 10],
) -> Result<()> {
    let [x, y, dy, dz, dx, gamma, dgamma, dbeta, mean, inv_std] = p;
    let (xd, cd) = descriptors(dt, dims)?;
    let (a, b) = (scale(&ONE), scale(&ZERO));
    // SAFETY: as `forward_training`.
    unsafe {
        let grad = if relu {
            let act = relu_desc()?;
            // ReLU's gradient only looks at the sign of its output (y > 0 exactly where its input is).
            sys::cudnnActivationBackward(h, act.0, a, xd.0, ptr(y), xd.0, ptr(dy), xd.0, ptr(y), b, xd.0, ptr(dz))
                .result()
                .map_err(|e| fail("cudnnActivationBackward", e))?;
            dz
        } else {
            dy
        };
        sys::cudnnBatchNormalizationBackward(
            h,
            SPATIAL,
            a,
            b,
            a,
            b,
            xd.0,
            ptr(x),
            xd.0,
            ptr(grad),
            xd.0,
            ptr(dx),
            cd.0,
            ptr(gamma),
            ptr(dgamma),
            ptr(dbeta),
            eps,
            ptr(mean),
            ptr(inv_std),
        )
        .result()
        .map_err(|e| fail("cudnnBatchNormalizationBackward", e))
    }
}
