//! f64 references on the CPU, written as the definitions read, for checking the fast paths: the
//! convolution (forward and all gradients), the max-pool, and the GELU with its derivative.

use burn::tensor::ops::ConvOptions;
use rand::{Rng, SeedableRng};

/// One convolution problem: input `[n, c, h, w]`, filter `[k, c / groups, r, s]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[allow(missing_docs)]
pub struct Conv2dCase {
    pub n: usize,
    pub c: usize,
    pub h: usize,
    pub w: usize,
    pub k: usize,
    pub r: usize,
    pub s: usize,
    pub stride: [usize; 2],
    pub pad: [usize; 2],
    pub dil: [usize; 2],
    pub groups: usize,
    pub bias: bool,
}

impl Conv2dCase {
    /// A patch embedding of a batch of 2: `kernel`-sized patches of stride `kernel`, no
    /// padding, dilation or groups.
    pub fn patches(c: usize, [h, w]: [usize; 2], k: usize, kernel: [usize; 2], bias: bool) -> Self {
        let [r, s] = kernel;
        Self { n: 2, c, h, w, k, r, s, stride: kernel, pad: [0, 0], dil: [1, 1], groups: 1, bias }
    }

    /// Output height and width.
    pub fn out_hw(&self) -> [usize; 2] {
        let o =
            |i: usize, size: usize, k: usize| (size + 2 * self.pad[i] - self.dil[i] * (k - 1) - 1) / self.stride[i] + 1;
        [o(0, self.h, self.r), o(1, self.w, self.s)]
    }
    /// `[n, c, h, w]`.
    pub fn x_dims(&self) -> [usize; 4] {
        [self.n, self.c, self.h, self.w]
    }
    /// `[k, c / groups, r, s]`.
    pub fn w_dims(&self) -> [usize; 4] {
        [self.k, self.c / self.groups, self.r, self.s]
    }
    /// `[n, k, p, q]`.
    pub fn y_dims(&self) -> [usize; 4] {
        let [p, q] = self.out_hw();
        [self.n, self.k, p, q]
    }
    /// Burn's options for this case.
    pub fn options(&self) -> ConvOptions<2> {
        ConvOptions::new(self.stride, self.pad, self.dil, self.groups)
    }
    /// Seeded inputs x, w, bias and an upstream gradient g, each value in ±[0.1, 1] (never zero,
    /// so a dropped term always shows).
    pub fn random_inputs(&self, seed: u64) -> (Vec<f64>, Vec<f64>, Vec<f64>, Vec<f64>) {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
        let mut v = |n: usize| -> Vec<f64> {
            (0..n)
                .map(|_| {
                    let m: f64 = rng.random_range(0.1..1.0);
                    if rng.random_bool(0.5) { m } else { -m }
                })
                .collect()
        };
        let x = v(self.x_dims().iter().product());
        let w = v(self.w_dims().iter().product());
        let b = v(self.k);
        let g = v(self.y_dims().iter().product());
        (x, w, b, g)
    }

    /// Calls `f(x_index, w_index, y_index)` for every multiply-add of the convolution.
    fn for_each_tap(&self, mut f: impl FnMut(usize, usize, usize)) {
        let [p, q] = self.out_hw();
        let (cg, kg) = (self.c / self.groups, self.k / self.groups);
        for n in 0..self.n {
            for k in 0..self.k {
                let g = k / kg;
                for oy in 0..p {
                    for ox in 0..q {
                        let yi = ((n * self.k + k) * p + oy) * q + ox;
                        for ci in 0..cg {
                            let c = g * cg + ci;
                            for r in 0..self.r {
                                let iy = (oy * self.stride[0] + r * self.dil[0]) as isize - self.pad[0] as isize;
                                if iy < 0 || iy >= self.h as isize {
                                    continue;
                                }
                                for s in 0..self.s {
                                    let ix = (ox * self.stride[1] + s * self.dil[1]) as isize - self.pad[1] as isize;
                                    if ix < 0 || ix >= self.w as isize {
                                        continue;
                                    }
                                    let xi = ((n * self.c + c) * self.h + iy as usize) * self.w + ix as usize;
                                    let wi = ((k * cg + ci) * self.r + r) * self.s + s;
                                    f(xi, wi, yi);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
}

/// The convolution's output in f64 (with the bias when the case has one).
pub fn conv2d_f64(case: &Conv2dCase, x: &[f64], w: &[f64], bias: &[f64]) -> Vec<f64> {
    let [n, k, p, q] = case.y_dims();
    let mut y = vec![0.0; n * k * p * q];
    case.for_each_tap(|xi, wi, yi| y[yi] += x[xi] * w[wi]);
    if case.bias {
        for (i, v) in y.iter_mut().enumerate() {
            *v += bias[(i / (p * q)) % k];
        }
    }
    y
}

/// Gradients of `sum(conv2d(x, w, b) * g)` with respect to x, w and b, in f64.
pub fn conv2d_grads_f64(case: &Conv2dCase, x: &[f64], w: &[f64], g: &[f64]) -> (Vec<f64>, Vec<f64>, Vec<f64>) {
    let mut dx = vec![0.0; x.len()];
    let mut dw = vec![0.0; w.len()];
    case.for_each_tap(|xi, wi, yi| {
        dx[xi] += w[wi] * g[yi];
        dw[wi] += x[xi] * g[yi];
    });
    let [_, k, p, q] = case.y_dims();
    let mut db = vec![0.0; k];
    for (i, v) in g.iter().enumerate() {
        db[(i / (p * q)) % k] += v;
    }
    (dx, dw, db)
}

/// The largest absolute difference over the largest reference magnitude: near-zero reference
/// elements (sums that cancel) do not blow it up, and any wrong element of normal size shows.
pub fn max_rel_err(got: &[f64], want: &[f64]) -> f64 {
    assert_eq!(got.len(), want.len(), "compared buffers differ in length");
    let scale = want.iter().fold(0f64, |m, v| m.max(v.abs())).max(f64::MIN_POSITIVE);
    got.iter().zip(want).fold(0f64, |m, (a, b)| m.max((a - b).abs())) / scale
}

/// A max-pool of NCHW `x` (`dims`; square `kernel`, `stride`, `pad` on every side, padded
/// positions never win) and the gradient of `Σ dy·y`: the outputs, row-major, and `dx`, where
/// each output's `dy` lands on its window's maximum (the first in row-major order on a tie).
///
/// # Panics
/// When `dy` does not have one value per output.
pub fn max_pool2d_f64(
    x: &[f64],
    [n, c, h, w]: [usize; 4],
    kernel: usize,
    stride: usize,
    pad: usize,
    dy: &[f64],
) -> (Vec<f64>, Vec<f64>) {
    let out = |len: usize| (len + 2 * pad - kernel) / stride + 1;
    let (ho, wo) = (out(h), out(w));
    assert_eq!(dy.len(), n * c * ho * wo, "one output gradient per output");
    let (mut y, mut dx) = (Vec::with_capacity(dy.len()), vec![0.0; x.len()]);
    for plane in 0..n * c {
        for (oy, ox) in (0..ho).flat_map(|oy| (0..wo).map(move |ox| (oy, ox))) {
            let window = (0..kernel).flat_map(|ky| (0..kernel).map(move |kx| (oy * stride + ky, ox * stride + kx)));
            let inside = window.filter(|&(iy, ix)| (pad..h + pad).contains(&iy) && (pad..w + pad).contains(&ix));
            let best = inside
                .map(|(iy, ix)| plane * h * w + (iy - pad) * w + ix - pad)
                .fold(None, |b: Option<usize>, i| if b.is_none_or(|b| x[i] > x[b]) { Some(i) } else { b });
            let best = best.expect("a window overlaps the input");
            dx[best] += dy[y.len()];
            y.push(x[best]);
        }
    }
    (y, dx)
}

/// The exact GELU `x·Φ(x) = x/2 · (1 + erf(x/√2))` (`torch.nn.GELU()`), in f64.
pub fn gelu_f64(x: f64) -> f64 {
    0.5 * x * (1.0 + libm::erf(x / std::f64::consts::SQRT_2))
}

/// The exact GELU's derivative `Φ(x) + x·φ(x)`, in f64.
pub fn gelu_grad_f64(x: f64) -> f64 {
    let pdf = (-0.5 * x * x).exp() / (2.0 * std::f64::consts::PI).sqrt();
    0.5 * (1.0 + libm::erf(x / std::f64::consts::SQRT_2)) + x * pdf
}
