//! CUDA kernels (cubecl) for batch norm (+ ReLU) on channels-last activations, seen as a
//! row-major `[rows, channels]` matrix (`rows = n·h·w`): the channels of one pixel are
//! contiguous. Every pass over the activations is a *column-tile* kernel: a thread owns a
//! vector of `N` neighbouring channels (up to 16 bytes: 8 bf16, 4 f32) and walks down the rows
//! of its block (rows `g·tile_y + ty`, stepping `groups·tile_y`), so threads side by side read
//! neighbouring memory, the per-channel parameters stay in registers, and no index is divided.
//!
//! Training forward: per-channel partial sums over blocks of rows, one pass ([`stats_partials`]);
//! a fold of each channel's partials ([`fold`]) gives the mean and `1/√(var+ε)` and blends the
//! running statistics ([`stats_finalize`]); one elementwise pass writes `relu?(γ·x̂ + β)` ([`normalize`]).
//! Backward: the same two-step reduction of `Σ dz` and `Σ dz·(x − mean)` ([`grad_partials`],
//! [`grad_finalize`]; `dz` is `dy` masked by the ReLU, recomputed from `x`), then one
//! elementwise pass for `dx` ([`input_grad`]). Seven passes over the activation memory in all;
//! arithmetic and statistics are f32 whatever the activations' type (`F`).
//!
//! A residual block's end, `relu(bn(x) + residual)`, is the same forward with the residual
//! added in [`normalize`] (one more read, where a separate addition and ReLU would read two
//! tensors and write one more); its backward masks `dy` by the saved output and writes the
//! masked gradient — the residual's — in the reduction pass ([`grad_partials_from_output`]).
//!
//! The sums are shifted by each channel's first value (`x[0, c]`) so that the variance
//! `E[d²] − E[d]²` does not cancel when the mean is large against the spread.

use cubecl::num_traits::Zero;
use cubecl::prelude::*;

/// Threads per channel of the warp-per-channel fold.
const FOLD: u32 = 32;
/// The coalesced fold's block: 32 neighbouring channels (the width [`fold_coalesced`]'s shared
/// memory is laid out for) × this many threads per channel.
const FOLD_DEPTH: u32 = 32;

/// The launch of a finalizing kernel over `channels` channels: blocks, threads, and the
/// kernels' `depth` (0: one warp per channel; see [`fold`] and `CudnnOptions::coalesced_fold`).
pub(crate) fn fold_launch(channels: usize) -> (CubeCount, CubeDim, u32) {
    if crate::nn::settings::options::get().coalesced_fold {
        (CubeCount::Static(channels.div_ceil(32) as u32, 1, 1), CubeDim::new_2d(32, FOLD_DEPTH), FOLD_DEPTH)
    } else {
        (CubeCount::Static(channels as u32, 1, 1), CubeDim::new_1d(FOLD), 0)
    }
}

/// `relu(v)` elementwise when `relu`, else `v`. The forward's output and the backward's mask
/// both come from this one comparison (`v > 0`), so they agree exactly.
#[cube]
fn relu_mask<N: Size>(v: Vector<f32, N>, dy: Vector<f32, N>, #[comptime] relu: bool) -> Vector<f32, N> {
    let mut out = dy;
    if relu {
        out = select_many(v.greater_than(Vector::zero()), dy, Vector::zero());
    }
    out
}

/// This thread's channel vector, first row and row step (see the module documentation).
#[cube]
fn tile_position(#[comptime] tile_x: u32, #[comptime] tile_y: u32, groups: usize) -> (usize, usize, usize) {
    let cv = CUBE_POS_X as usize * tile_x as usize + UNIT_POS_X as usize;
    let first = CUBE_POS_Y as usize * tile_y as usize + UNIT_POS_Y as usize;
    (cv, first, groups * tile_y as usize)
}

/// Adds up the `tile_y` threads' sums of each column of the block and writes them as
/// `partials[0, g, cv]` and `partials[1, g, cv]` (in vectors of `N` channels).
#[cube]
#[allow(clippy::too_many_arguments)]
fn store_partials<N: Size>(
    s1: Vector<f32, N>,
    s2: Vector<f32, N>,
    partials: &mut Tensor<Vector<f32, N>>,
    cv: usize,
    cols: usize,
    groups: usize,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
) {
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let mut sum1 = SharedMemory::<Vector<f32, N>>::new(tile_x as usize * tile_y as usize);
    let mut sum2 = SharedMemory::<Vector<f32, N>>::new(tile_x as usize * tile_y as usize);
    sum1[ty * tile_x as usize + tx] = s1;
    sum2[ty * tile_x as usize + tx] = s2;
    sync_cube();
    if ty == 0 && cv < cols {
        let mut a = s1;
        let mut b = s2;
        for k in 1..tile_y as usize {
            a += sum1[k * tile_x as usize + tx];
            b += sum2[k * tile_x as usize + tx];
        }
        let g = CUBE_POS_Y as usize;
        partials[g * cols + cv] = a;
        partials[(groups + g) * cols + cv] = b;
    }
}

/// Per block row `g`: `Σ (x − x[0])` and `Σ (x − x[0])²` for each channel.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stats_partials<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    partials: &mut Tensor<Vector<f32, N>>,
    rows: u32,
    cols: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, cols, groups) = (rows as usize, cols as usize, groups as usize);
    let (cv, first, step) = tile_position(tile_x, tile_y, groups);
    let mut s1 = Vector::<f32, N>::zero();
    let mut s2 = Vector::<f32, N>::zero();
    if cv < cols {
        let shift = Vector::<f32, N>::cast_from(x[cv]);
        let mut r = first;
        while r < rows {
            let d = Vector::<f32, N>::cast_from(x[r * cols + cv]) - shift;
            s1 += d;
            s2 += d * d;
            r += step;
        }
    }
    store_partials(s1, s2, partials, cv, cols, groups, tile_x, tile_y);
}

/// Which channel this thread folds, and whether it writes that channel's results: one warp per
/// channel when `depth` is 0, else a block of `CUBE_DIM_X` neighbouring channels × `depth`
/// threads each (see [`fold`]).
#[cube]
fn fold_target(channels: usize, #[comptime] depth: u32) -> (usize, bool) {
    let mut c = CUBE_POS_X as usize;
    let mut writes = UNIT_POS_X == 0;
    if comptime![depth > 0] {
        c = CUBE_POS_X as usize * CUBE_DIM_X as usize + UNIT_POS_X as usize;
        writes = UNIT_POS_Y == 0 && c < channels;
    }
    (c, writes)
}

/// Channel `c`'s two sums over all block rows, `Σ_g partials[0, g, c]` and
/// `Σ_g partials[1, g, c]`, valid in the thread [`fold_target`] names as the writer.
///
/// `depth` 0: the warp of the channel strides over the block rows and adds up its lanes — each
/// load its own memory transaction, and as many dependent steps as block rows / 32.
/// `depth` > 0 (the coalesced fold): the threads of a warp hold neighbouring channels, so one
/// load of the warp reads one line of a block row; thread row `ty` sums block rows `ty`,
/// `ty + depth`, … eight at a time (independent loads in flight), and the thread rows' sums
/// meet in shared memory, added in a fixed order.
#[cube]
fn fold(partials: &Tensor<f32>, c: usize, channels: usize, groups: usize, #[comptime] depth: u32) -> (f32, f32) {
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    if comptime![depth == 0] {
        let mut g = UNIT_POS_X as usize;
        while g < groups {
            s1 += partials[g * channels + c];
            s2 += partials[(groups + g) * channels + c];
            g += CUBE_DIM_X as usize;
        }
        s1 = plane_sum(s1);
        s2 = plane_sum(s2);
    } else {
        let (a, b) = fold_coalesced(partials, c, channels, groups, depth);
        s1 = a;
        s2 = b;
    }
    (s1, s2)
}

/// [`fold`]'s coalesced form (`depth` thread rows of `CUBE_DIM_X` = 32 channels): each thread
/// keeps eight sums of each kind, so sixteen loads are in flight per step (on an H200 a
/// dependent step costs about 0.5 µs, and the warp-per-channel fold takes one per 32 block rows).
#[cube]
fn fold_coalesced(
    partials: &Tensor<f32>,
    c: usize,
    channels: usize,
    groups: usize,
    #[comptime] depth: u32,
) -> (f32, f32) {
    let tx = UNIT_POS_X as usize;
    let ty = UNIT_POS_Y as usize;
    let width = CUBE_DIM_X as usize;
    let rows = depth as usize;
    let mut a0 = f32::new(0.0);
    let mut a1 = f32::new(0.0);
    let mut a2 = f32::new(0.0);
    let mut a3 = f32::new(0.0);
    let mut a4 = f32::new(0.0);
    let mut a5 = f32::new(0.0);
    let mut a6 = f32::new(0.0);
    let mut a7 = f32::new(0.0);
    let mut b0 = f32::new(0.0);
    let mut b1 = f32::new(0.0);
    let mut b2 = f32::new(0.0);
    let mut b3 = f32::new(0.0);
    let mut b4 = f32::new(0.0);
    let mut b5 = f32::new(0.0);
    let mut b6 = f32::new(0.0);
    let mut b7 = f32::new(0.0);
    if c < channels {
        // Block row g's first sum sits at `g·channels + c`, its second `second` further.
        let second = groups * channels;
        let step = rows * channels;
        let mut g = ty;
        while g + 7 * rows < groups {
            let i = g * channels + c;
            a0 += partials[i];
            b0 += partials[second + i];
            a1 += partials[i + step];
            b1 += partials[second + i + step];
            a2 += partials[i + 2 * step];
            b2 += partials[second + i + 2 * step];
            a3 += partials[i + 3 * step];
            b3 += partials[second + i + 3 * step];
            a4 += partials[i + 4 * step];
            b4 += partials[second + i + 4 * step];
            a5 += partials[i + 5 * step];
            b5 += partials[second + i + 5 * step];
            a6 += partials[i + 6 * step];
            b6 += partials[second + i + 6 * step];
            a7 += partials[i + 7 * step];
            b7 += partials[second + i + 7 * step];
            g += 8 * rows;
        }
        while g < groups {
            a0 += partials[g * channels + c];
            b0 += partials[second + g * channels + c];
            g += rows;
        }
    }
    let mut sums1 = SharedMemory::<f32>::new(32 * depth as usize);
    let mut sums2 = SharedMemory::<f32>::new(32 * depth as usize);
    sums1[ty * width + tx] = ((a0 + a1) + (a2 + a3)) + ((a4 + a5) + (a6 + a7));
    sums2[ty * width + tx] = ((b0 + b1) + (b2 + b3)) + ((b4 + b5) + (b6 + b7));
    sync_cube();
    let mut s1 = f32::new(0.0);
    let mut s2 = f32::new(0.0);
    if ty == 0 {
        for k in 0..rows {
            s1 += sums1[k * width + tx];
            s2 += sums2[k * width + tx];
        }
    }
    (s1, s2)
}

/// Per channel ([`fold`]): `mean` and `inv_std = 1/√(var + eps)` from the partials (`var` the
/// biased batch variance), and the running statistics blended as burn's BatchNorm does:
/// `new_running = (1 − momentum)·running + momentum·batch`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn stats_finalize<F: Float>(
    x: &Tensor<F>,
    partials: &Tensor<f32>,
    running_mean: &Tensor<f32>,
    running_var: &Tensor<f32>,
    mean: &mut Tensor<f32>,
    inv_std: &mut Tensor<f32>,
    new_running_mean: &mut Tensor<f32>,
    new_running_var: &mut Tensor<f32>,
    rows: u32,
    channels: u32,
    groups: u32,
    eps: f32,
    momentum: f32,
    #[comptime] depth: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (c, writes) = fold_target(channels as usize, depth);
    let (s1, s2) = fold(partials, c, channels as usize, groups as usize, depth);
    if writes {
        let n = f32::cast_from(rows);
        let m1 = s1 / n;
        let mut v = s2 / n - m1 * m1;
        if v < f32::new(0.0) {
            v = f32::new(0.0);
        }
        let mu = f32::cast_from(x[c]) + m1;
        mean[c] = mu;
        inv_std[c] = f32::new(1.0) / f32::sqrt(v + eps);
        let keep = f32::new(1.0) - momentum;
        new_running_mean[c] = keep * running_mean[c] + momentum * mu;
        new_running_var[c] = keep * running_var[c] + momentum * v;
    }
}

/// Per channel ([`fold`]): this batch's moments for SyncBatchNorm's exchange, laid out as
/// `[count, mean[0..c], M2[0..c]]` with `M2 = Σ (x − mean)²` (Chan's parallel-variance input).
#[cube(launch)]
pub(crate) fn moments_finalize<F: Float>(
    x: &Tensor<F>,
    partials: &Tensor<f32>,
    moments: &mut Tensor<f32>,
    rows: u32,
    channels: u32,
    groups: u32,
    #[comptime] depth: u32,
    #[define(F)] _dtype: StorageType,
) {
    let (c, writes) = fold_target(channels as usize, depth);
    let (s1, s2) = fold(partials, c, channels as usize, groups as usize, depth);
    if writes {
        let n = f32::cast_from(rows);
        let m1 = s1 / n;
        let mut m2 = s2 - n * m1 * m1;
        if m2 < f32::new(0.0) {
            m2 = f32::new(0.0);
        }
        if c == 0 {
            moments[0] = n;
        }
        moments[1 + c] = f32::cast_from(x[c]) + m1;
        moments[1 + channels as usize + c] = m2;
    }
}

/// `y = relu?(γ·inv_std·(x − mean) + β [+ residual])`, in `F`; `residual` is read only when
/// `add` (callers without one pass any tensor of the same type).
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn normalize<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    residual: &Tensor<Vector<F, N>>,
    y: &mut Tensor<Vector<F, N>>,
    mean: &Tensor<Vector<f32, N>>,
    inv_std: &Tensor<Vector<f32, N>>,
    gamma: &Tensor<Vector<f32, N>>,
    beta: &Tensor<Vector<f32, N>>,
    rows: u32,
    cols: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[comptime] relu: bool,
    #[comptime] add: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, cols, groups) = (rows as usize, cols as usize, groups as usize);
    let (cv, first, step) = tile_position(tile_x, tile_y, groups);
    if cv >= cols {
        terminate!();
    }
    let mu = mean[cv];
    let scale = gamma[cv] * inv_std[cv];
    let b = beta[cv];
    let mut r = first;
    while r < rows {
        let i = r * cols + cv;
        let mut v = (Vector::<f32, N>::cast_from(x[i]) - mu) * scale + b;
        if add {
            v += Vector::<f32, N>::cast_from(residual[i]);
        }
        y[i] = Vector::cast_from(relu_mask(v, v, relu));
        r += step;
    }
}

/// Per block row `g`: `Σ dz` and `Σ dz·(x − mean)` for each channel, `dz` being `dy` where the
/// forward's ReLU let the value through.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn grad_partials<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    mean: &Tensor<Vector<f32, N>>,
    inv_std: &Tensor<Vector<f32, N>>,
    gamma: &Tensor<Vector<f32, N>>,
    beta: &Tensor<Vector<f32, N>>,
    partials: &mut Tensor<Vector<f32, N>>,
    rows: u32,
    cols: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, cols, groups) = (rows as usize, cols as usize, groups as usize);
    let (cv, first, step) = tile_position(tile_x, tile_y, groups);
    let mut s1 = Vector::<f32, N>::zero();
    let mut s2 = Vector::<f32, N>::zero();
    if cv < cols {
        let mu = mean[cv];
        let scale = gamma[cv] * inv_std[cv];
        let b = beta[cv];
        let mut r = first;
        while r < rows {
            let i = r * cols + cv;
            let d = Vector::<f32, N>::cast_from(x[i]) - mu;
            let dz = relu_mask(d * scale + b, Vector::<f32, N>::cast_from(dy[i]), relu);
            s1 += dz;
            s2 += dz * d;
            r += step;
        }
    }
    store_partials(s1, s2, partials, cv, cols, groups, tile_x, tile_y);
}

/// [`grad_partials`] for `y = relu(bn(x) + residual)`: the mask comes from the saved output
/// (`y > 0`, exactly where the sum is), and `dz` — also the residual's gradient — is written
/// out for [`input_grad`] and the caller. `in_place`: `dz` holds `dy` on entry (a gradient no
/// other tensor reads, its buffer reused) and `dy` is not read.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn grad_partials_from_output<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    y: &Tensor<Vector<F, N>>,
    mean: &Tensor<Vector<f32, N>>,
    dz: &mut Tensor<Vector<F, N>>,
    partials: &mut Tensor<Vector<f32, N>>,
    rows: u32,
    cols: u32,
    groups: u32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[comptime] in_place: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, cols, groups) = (rows as usize, cols as usize, groups as usize);
    let (cv, first, step) = tile_position(tile_x, tile_y, groups);
    let mut s1 = Vector::<f32, N>::zero();
    let mut s2 = Vector::<f32, N>::zero();
    if cv < cols {
        let mu = mean[cv];
        let mut r = first;
        while r < rows {
            let i = r * cols + cv;
            let d = Vector::<f32, N>::cast_from(x[i]) - mu;
            let incoming =
                if in_place { Vector::<f32, N>::cast_from(dz[i]) } else { Vector::<f32, N>::cast_from(dy[i]) };
            let g = relu_mask(Vector::<f32, N>::cast_from(y[i]), incoming, true);
            dz[i] = Vector::cast_from(g);
            s1 += g;
            s2 += g * d;
            r += step;
        }
    }
    store_partials(s1, s2, partials, cv, cols, groups, tile_x, tile_y);
}

/// Per channel ([`fold`]): `dβ = Σ dz`, `dγ = inv_std · Σ dz·(x − mean)`.
#[cube(launch)]
pub(crate) fn grad_finalize(
    partials: &Tensor<f32>,
    inv_std: &Tensor<f32>,
    dgamma: &mut Tensor<f32>,
    dbeta: &mut Tensor<f32>,
    channels: u32,
    groups: u32,
    #[comptime] depth: u32,
) {
    let (c, writes) = fold_target(channels as usize, depth);
    let (s1, s2) = fold(partials, c, channels as usize, groups as usize, depth);
    if writes {
        dbeta[c] = s1;
        dgamma[c] = s2 * inv_std[c];
    }
}

/// `dx = γ·inv_std·(dz − dβ/m − (x − mean)·inv_std·dγ/m)`, in `F`.
#[cube(launch)]
#[allow(clippy::too_many_arguments)]
pub(crate) fn input_grad<F: Float, N: Size>(
    x: &Tensor<Vector<F, N>>,
    dy: &Tensor<Vector<F, N>>,
    dx: &mut Tensor<Vector<F, N>>,
    mean: &Tensor<Vector<f32, N>>,
    inv_std: &Tensor<Vector<f32, N>>,
    gamma: &Tensor<Vector<f32, N>>,
    beta: &Tensor<Vector<f32, N>>,
    dgamma: &Tensor<Vector<f32, N>>,
    dbeta: &Tensor<Vector<f32, N>>,
    rows: u32,
    cols: u32,
    groups: u32,
    inv_rows: f32,
    #[comptime] tile_x: u32,
    #[comptime] tile_y: u32,
    #[comptime] relu: bool,
    #[define(F)] _dtype: StorageType,
) {
    let (rows, cols, groups) = (rows as usize, cols as usize, groups as usize);
    let (cv, first, step) = tile_position(tile_x, tile_y, groups);
    if cv >= cols {
        terminate!();
    }
    let mu = mean[cv];
    let is = inv_std[cv];
    let scale = gamma[cv] * is;
    let b = beta[cv];
    let per_row = Vector::<f32, N>::new(inv_rows);
    let k1 = dbeta[cv] * per_row;
    let k2 = is * dgamma[cv] * per_row;
    let mut r = first;
    while r < rows {
        let i = r * cols + cv;
        let d = Vector::<f32, N>::cast_from(x[i]) - mu;
        let dz = relu_mask(d * scale + b, Vector::<f32, N>::cast_from(dy[i]), relu);
        dx[i] = Vector::cast_from(scale * (dz - k1 - d * k2));
        r += step;
    }
}
