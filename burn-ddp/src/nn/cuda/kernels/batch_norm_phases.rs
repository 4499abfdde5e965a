//! The channels-last batch norm kernels ([`crate::nn::cuda::kernels::batch_norm_nhwc`]) as separate phases, for a
//! batch norm whose statistics come from elsewhere between them — SyncBatchNorm, which
//! exchanges each rank's moments after the first phase and the gradient sums before the last:
//!
//! forward: [`moments`] (this batch's count, mean, M2) → the caller's exchange → [`normalize`]
//! with the combined mean and `1/√(var+ε)`;
//! backward: [`grad_sums`] (this batch's `Σ dz·(x − mean)·inv_std` and `Σ dz`) → the caller's
//! sum over ranks, divided by the total count → [`input_grad`].
//!
//! Each phase is one operation of burn-fusion's stream (`fusion_op`), kernels on burn's own
//! stream: no fence, no host wait. Activations in f32, bf16 or f16; statistics and parameters
//! f32, shape `[c]`.

use crate::error::{Error, Result};
use crate::nn::cuda::kernels::batch_norm_nhwc as k;
use crate::nn::cuda::ops::batch_norm_nhwc::{CALLS, Tiling, arg, extent, normalize as normalize_kernel, require_f32};
use crate::nn::cuda::runtime::fusion_op::{self, Cube, packed};
use crate::nn::cuda::runtime::launch::{Prim, empty, empty_f32};
use burn::prelude::*;
use burn::tensor::DType;
use cubecl::cuda::CudaRuntime;
use std::sync::atomic::Ordering;

/// The per-channel affine map of the normalisation: `relu?(γ·inv_std·(x − mean) + β)`.
#[derive(Debug, Clone)]
pub(crate) struct Affine {
    pub mean: Prim,
    pub inv_std: Prim,
    pub gamma: Prim,
    pub beta: Prim,
    pub relu: bool,
}

impl Affine {
    fn check(&self, c: usize) -> Result<()> {
        for (t, what) in
            [(&self.mean, "mean"), (&self.inv_std, "inv_std"), (&self.gamma, "gamma"), (&self.beta, "beta")]
        {
            require_f32(t, what)?;
            if t.shape.as_slice() != [c] {
                return Err(Error::Kernel {
                    op: "channels-last batch norm",
                    reason: format!("{what} has shape {:?} for {c} channels", t.shape.as_slice()),
                });
            }
        }
        Ok(())
    }

    fn prims(&self) -> [Prim; 4] {
        [self.mean.clone(), self.inv_std.clone(), self.gamma.clone(), self.beta.clone()]
    }
}

/// `[count, mean[0..c], M2[0..c]]` (f32) of channels-last `x` `[n, h, w, c]`:
/// `count = n·h·w`, `M2 = Σ (x − mean)²` per channel.
///
/// # Errors
/// What the kernels do not take (see `cuda::ops::batch_norm_nhwc`).
pub(crate) fn moments(x: &Prim) -> Result<Prim> {
    let (rows, c) = extent(x)?;
    let out =
        fusion_op::queue("bn_nhwc_moments", vec![x.clone()], &[(Shape::new([2 * c + 1]), DType::F32)], move |ins| {
            let x = packed(ins.into_iter().next().expect("one input"));
            let moments = empty_f32(&x, &[2 * c + 1]);
            let t = Tiling::new(rows, c, x.dtype.size(), &[&x]);
            let partials = empty_f32(&x, &[2, t.groups, c]);
            let (count, dim) = t.grid();
            let (rows32, groups32) = (rows as u32, t.groups as u32);
            k::stats_partials::launch::<CudaRuntime>(
                &x.client,
                count,
                dim,
                t.n,
                arg(&x),
                arg(&partials),
                rows32,
                t.cols as u32,
                groups32,
                t.tile_x,
                t.tile_y,
                x.dtype.into(),
            );
            let (fold_count, fold_dim, depth) = k::fold_launch(c);
            k::moments_finalize::launch::<CudaRuntime>(
                &x.client,
                fold_count,
                fold_dim,
                arg(&x),
                arg(&partials),
                arg(&moments),
                rows32,
                c as u32,
                groups32,
                depth,
                x.dtype.into(),
            );
            CALLS.fetch_add(1, Ordering::Relaxed);
            vec![moments]
        });
    Ok(out.into_iter().next().expect("one output"))
}

/// `relu?(γ·inv_std·(x − mean) + β)` in `x`'s type.
///
/// # Errors
/// What the kernels do not take.
pub(crate) fn normalize(x: &Prim, a: &Affine) -> Result<Prim> {
    let (rows, c) = extent(x)?;
    a.check(c)?;
    let (shape, relu) = (x.shape.clone(), a.relu);
    let inputs = [vec![x.clone()], a.prims().to_vec()].concat();
    let out = fusion_op::queue("bn_nhwc_normalize", inputs, &[fusion_op::like(x)], move |ins| {
        let [x, mean, inv_std, gamma, beta]: [Cube; 5] =
            ins.into_iter().map(packed).collect::<Vec<_>>().try_into().expect("five inputs");
        let y = empty(&x, shape.as_slice());
        normalize_kernel(&x, None, &y, &mean, &inv_std, &gamma, &beta, (rows, c), relu);
        vec![y]
    });
    Ok(out.into_iter().next().expect("one output"))
}

fn check_gradient(x: &Prim, dy: &Prim) -> Result<()> {
    if dy.shape != x.shape || dy.dtype != x.dtype {
        return Err(Error::Kernel {
            op: "channels-last batch norm backward",
            reason: format!("gradient {:?} {:?} for input {:?} {:?}", dy.shape, dy.dtype, x.shape, x.dtype),
        });
    }
    Ok(())
}

/// This batch's `(dγ, dβ) = (inv_std·Σ dz·(x − mean), Σ dz)`, `dz` being `dy` where the ReLU
/// let the value through.
///
/// # Errors
/// What the kernels do not take.
pub(crate) fn grad_sums(x: &Prim, dy: &Prim, a: &Affine) -> Result<(Prim, Prim)> {
    let (rows, c) = extent(x)?;
    a.check(c)?;
    check_gradient(x, dy)?;
    let relu = a.relu;
    let inputs = [vec![x.clone(), dy.clone()], a.prims().to_vec()].concat();
    let stat = (Shape::new([c]), DType::F32);
    let out = fusion_op::queue("bn_nhwc_grad_sums", inputs, &[stat.clone(), stat], move |ins| {
        let [x, dy, mean, inv_std, gamma, beta]: [Cube; 6] =
            ins.into_iter().map(packed).collect::<Vec<_>>().try_into().expect("six inputs");
        let (dgamma, dbeta) = (empty_f32(&x, &[c]), empty_f32(&x, &[c]));
        let t = Tiling::new(rows, c, x.dtype.size(), &[&x, &dy, &mean, &inv_std, &gamma, &beta]);
        let partials = empty_f32(&x, &[2, t.groups, c]);
        let (count, dim) = t.grid();
        let (rows32, groups32) = (rows as u32, t.groups as u32);
        let client = &x.client;
        let ops = (arg(&mean), arg(&inv_std), arg(&gamma), arg(&beta));
        k::grad_partials::launch::<CudaRuntime>(
            client,
            count,
            dim,
            t.n,
            arg(&x),
            arg(&dy),
            ops.0,
            ops.1,
            ops.2,
            ops.3,
            arg(&partials),
            rows32,
            t.cols as u32,
            groups32,
            t.tile_x,
            t.tile_y,
            relu,
            x.dtype.into(),
        );
        let (fold_count, fold_dim, depth) = k::fold_launch(c);
        k::grad_finalize::launch::<CudaRuntime>(
            client,
            fold_count,
            fold_dim,
            arg(&partials),
            arg(&inv_std),
            arg(&dgamma),
            arg(&dbeta),
            c as u32,
            groups32,
            depth,
        );
        vec![dgamma, dbeta]
    });
    let [dgamma, dbeta]: [Prim; 2] = out.try_into().expect("two outputs");
    Ok((dgamma, dbeta))
}

/// `dx = γ·inv_std·(dz − dβ/m − (x − mean)·inv_std·dγ/m)` in `x`'s type, given `dγ/m` and `dβ/m`
/// (the sums over every rank's batch divided by their total count `m`).
///
/// # Errors
/// What the kernels do not take.
pub(crate) fn input_grad(x: &Prim, dy: &Prim, a: &Affine, dgamma_per_row: Prim, dbeta_per_row: Prim) -> Result<Prim> {
    let (rows, c) = extent(x)?;
    a.check(c)?;
    check_gradient(x, dy)?;
    let (shape, relu) = (x.shape.clone(), a.relu);
    let inputs = [vec![x.clone(), dy.clone()], a.prims().to_vec(), vec![dgamma_per_row, dbeta_per_row]].concat();
    let out = fusion_op::queue("bn_nhwc_input_grad", inputs, &[fusion_op::like(x)], move |ins| {
        let [x, dy, mean, inv_std, gamma, beta, dgamma, dbeta]: [Cube; 8] =
            ins.into_iter().map(packed).collect::<Vec<_>>().try_into().expect("eight inputs");
        let dx = empty(&x, shape.as_slice());
        let t = Tiling::new(rows, c, x.dtype.size(), &[&x, &dy, &dx, &mean, &inv_std, &gamma, &beta, &dgamma, &dbeta]);
        let (count, dim) = t.grid();
        let stats = (arg(&mean), arg(&inv_std), arg(&gamma), arg(&beta), arg(&dgamma), arg(&dbeta));
        k::input_grad::launch::<CudaRuntime>(
            &x.client,
            count,
            dim,
            t.n,
            arg(&x),
            arg(&dy),
            arg(&dx),
            stats.0,
            stats.1,
            stats.2,
            stats.3,
            stats.4,
            stats.5,
            rows as u32,
            t.cols as u32,
            t.groups as u32,
            1.0,
            t.tile_x,
            t.tile_y,
            relu,
            x.dtype.into(),
        );
        CALLS.fetch_add(1, Ordering::Relaxed);
        vec![dx]
    });
    Ok(out.into_iter().next().expect("one output"))
}
