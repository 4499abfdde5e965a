//! CUDA kernels (cubecl) for batch norm (+ ReLU) on channels-last activations, seen as a
//! row-major `[rows, channels]` matrix (`rows = n·h·w`): the channels of one pixel are
//! contiguous, so threads side by side read neighbouring channels of the same row.
//!
//! Training forward: per-channel partial sums over blocks of rows, one pass ([`stats_partials`]);
//! one warp per channel folds the partials into the mean, the biased variance and `1/√(var+ε)`
//! ([`stats_finalize`]); one elementwise pass writes `relu?(γ·x̂ + β)` ([`normalize`]).
//! Backward: the same two-step reduction of `Σ dz` and `Σ dz·(x − mean)` ([`grad_partials`],
//! [`grad_finalize`]; `dz` is `dy` masked by the ReLU, recomputed from `x`), then one
//! elementwise pass for `dx` ([`input_grad`]). Seven passes over the activation memory in all;
//! arithmetic and statistics are f32 whatever the activations' type (`F`).
//!
//! The sums are shifted by each channel's first value (`x[0, c]`) so that the variance
//! `E[d²] − E[d]²` does not cancel when the mean is large against the spread.

use cubecl::prelude::*;

/// Threads of a partial-sum block along the channels (one warp) and along the rows.
pub(super) const TILE_X: u32 = 32;
pub(super) const TILE_Y: u32 = 8;
/// One warp per channel folds the partial sums.
pub(super) const FOLD: u32 = 32;

/// `γ·(x − mean)·inv_std + β` in f32: the one formula the forward pass and the ReLU mask of the
/// backward pass share, so the mask is exactly the forward's.
#[cube]
fn affine(d: f32, scale: f32, beta: f32) -> f32 {
    d * scale + beta
}

/// `partials[0, g, c] = Σ (x[r, c] − x[0, c])`, `partials[1, g, c] = Σ (x[r, c] − x[0, c])²`
/// over the rows `r ≡ g·TILE_Y + ty (mod groups·TILE_Y)` of block row `g`.
#[cube(launch)]
pub(super) fn stats_partials<F: Float>(
    x: &Tensor<F>,
    partials: &mut Tensor<f32>,
    rows: u32,
    channels: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[define(F)] _dtype: StorageType,
) {
    let channels = channels as usize;
    let rows = rows as usize;
    let groups = groups as usize;
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let g = CUBE_POS_Y as usize;
    let c = CUBE_POS_X as usize * tile_x as usize + tx;
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    if c < channels {
        let shift = f32::cast_from(x[c]);
        let step = groups * tile_y as usize;
        let mut r = g * tile_y as usize + ty;
        while r < rows {
            let d = f32::cast_from(x[r * channels + c]) - shift;
            s1 += d;
            s2 += d * d;
            r += step;
        }
    }
    let mut sum1 = SharedMemory::<f32>::new(tile_x as usize * tile_y as usize);
    let mut sum2 = SharedMemory::<f32>::new(tile_x as usize * tile_y as usize);
    sum1[ty * tile_x as usize + tx] = s1;
    sum2[ty * tile_x as usize + tx] = s2;
    sync_cube();
    if ty == 0 && c < channels {
        for k in 1..tile_y as usize {
            s1 += sum1[k * tile_x as usize + tx];
            s2 += sum2[k * tile_x as usize + tx];
        }
        partials[g * channels + c] = s1;
        partials[(groups + g) * channels + c] = s2;
    }
}

/// One warp per channel: `mean`, biased `var` and `inv_std = 1/√(var + eps)` from the partials.
#[cube(launch)]
pub(super) fn stats_finalize<F: Float>(
    x: &Tensor<F>,
    partials: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    var: &mut Tensor<f32>,
    inv_std: &mut Tensor<f32>,
    rows: u32,
    channels: u32,
    groups: u32,
    eps: f32,
    #[define(F)] _dtype: StorageType,
) {
    let c = CUBE_POS_X as usize;
    let channels = channels as usize;
    let groups = groups as usize;
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    let mut g = UNIT_POS_X as usize;
    while g < groups {
        s1 += partials[g * channels + c];
        s2 += partials[(groups + g) * channels + c];
        g += CUBE_DIM_X as usize;
    }
    let s1 = plane_sum(s1);
    let s2 = plane_sum(s2);
    if UNIT_POS_X == 0 {
        let n = f32::cast_from(rows);
        let m1 = s1 / n;
        let mut v = s2 / n - m1 * m1;
        if v < f32::new(0.0) {
            v = f32::new(0.0);
        }
        mean[c] = f32::cast_from(x[c]) + m1;
        var[c] = v;
        inv_std[c] = f32::new(1.0) / f32::sqrt(v + eps);
    }
}

/// `y = relu?(γ·(x − mean)·inv_std + β)`, one element per thread, in `F`.
#[cube(launch)]
pub(super) fn normalize<F: Float>(
    x: &Tensor<F>,
    y: &mut Tensor<F>,
    mean: &Tensor<f32>,
    inv_std: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    channels: u32,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= y.len() {
        terminate!();
    }
    let c = i % channels as usize;
    let mut v = affine(f32::cast_from(x[i]) - mean[c], gamma[c] * inv_std[c], beta[c]);
    if relu {
        if v < f32::new(0.0) {
            v = f32::new(0.0);
        }
    }
    y[i] = F::cast_from(v);
}

/// `dy` where the forward's ReLU let the value through (all of `dy` without ReLU).
#[cube]
fn masked(dy: f32, d: f32, scale: f32, beta: f32, #[comptime] relu: bool) -> f32 {
    let mut dz = dy;
    if relu {
        if affine(d, scale, beta) <= f32::new(0.0) {
            dz = f32::new(0.0);
        }
    }
    dz
}

/// `partials[0, g, c] = Σ dz`, `partials[1, g, c] = Σ dz·(x − mean)` over block row `g`'s rows.
#[cube(launch)]
pub(super) fn grad_partials<F: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    mean: &Tensor<f32>,
    inv_std: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    partials: &mut Tensor<f32>,
    rows: u32,
    channels: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let channels = channels as usize;
    let rows = rows as usize;
    let groups = groups as usize;
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let g = CUBE_POS_Y as usize;
    let c = CUBE_POS_X as usize * tile_x as usize + tx;
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    if c < channels {
        let mu = mean[c];
        let scale = gamma[c] * inv_std[c];
        let b = beta[c];
        let step = groups * tile_y as usize;
        let mut r = g * tile_y as usize + ty;
        while r < rows {
            let i = r * channels + c;
            let d = f32::cast_from(x[i]) - mu;
            let dz = masked(f32::cast_from(dy[i]), d, scale, b, relu);
            s1 += dz;
            s2 += dz * d;
            r += step;
        }
    }
    let mut sum1 = SharedMemory::<f32>::new(tile_x as usize * tile_y as usize);
    let mut sum2 = SharedMemory::<f32>::new(tile_x as usize * tile_y as usize);
    sum1[ty * tile_x as usize + tx] = s1;
    sum2[ty * tile_x as usize + tx] = s2;
    sync_cube();
    if ty == 0 && c < channels {
        for k in 1..tile_y as usize {
            s1 += sum1[k * tile_x as usize + tx];
            s2 += sum2[k * tile_x as usize + tx];
        }
        partials[g * channels + c] = s1;
        partials[(groups + g) * channels + c] = s2;
    }
}

/// One warp per channel: `dβ = Σ dz`, `dγ = inv_std · Σ dz·(x − mean)`.
#[cube(launch)]
pub(super) fn grad_finalize(
    partials: &Tensor<f32>,
    inv_std: &Tensor<f32>,
    dgamma: &mut Tensor<f32>,
    dbeta: &mut Tensor<f32>,
    channels: u32,
    groups: u32,
) {
    let c = CUBE_POS_X as usize;
    let channels = channels as usize;
    let groups = groups as usize;
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    let mut g = UNIT_POS_X as usize;
    while g < groups {
        s1 += partials[g * channels + c];
        s2 += partials[(groups + g) * channels + c];
        g += CUBE_DIM_X as usize;
    }
    let s1 = plane_sum(s1);
    let s2 = plane_sum(s2);
    if UNIT_POS_X == 0 {
        dbeta[c] = s1;
        dgamma[c] = s2 * inv_std[c];
    }
}

/// `dx = γ·inv_std·(dz − dβ/m − (x − mean)·inv_std·dγ/m)`, one element per thread, in `F`.
#[cube(launch)]
pub(super) fn input_grad<F: Float>(
    x: &Tensor<F>,
    dy: &Tensor<F>,
    dx: &mut Tensor<F>,
    mean: &Tensor<f32>,
    inv_std: &Tensor<f32>,
    gamma: &Tensor<f32>,
    beta: &Tensor<f32>,
    dgamma: &Tensor<f32>,
    dbeta: &Tensor<f32>,
    channels: u32,
    inv_rows: f32,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let i = ABSOLUTE_POS;
    if i >= dx.len() {
        terminate!();
    }
    let c = i % channels as usize;
    let is = inv_std[c];
    let scale = gamma[c] * is;
    let d = f32::cast_from(x[i]) - mean[c];
    let dz = masked(f32::cast_from(dy[i]), d, scale, beta[c], relu);
    let v = scale * (dz - dbeta[c] * inv_rows - d * is * dgamma[c] * inv_rows);
    dx[i] = F::cast_from(v);
}
