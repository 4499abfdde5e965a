//! 2-D convolution that takes the fastest path the backend has: cuDNN on burn-cuda (forward and
//! both gradients, with `feature = "cuda"`), burn's own kernels everywhere else.

use super::Layout;
use crate::grad_ready::param_val;
use crate::nn::layers::Conv2d;
use crate::nn::linear::affine;
use crate::nn::runtime::report::note_path;
use burn::prelude::*;
use burn::tensor::ops::ConvOptions;
use burn_nn::PaddingConfig2d;

/// How many convolution filters (and filter gradients) the filter kernel has reordered and cast
/// in this process (`CudnnOptions::filter_kernel`; 0 without CUDA): whether that path ran.
pub fn filter_kernel_calls() -> usize {
    #[cfg(feature = "cuda")]
    return crate::nn::cuda::kernels::filter_reorder::calls();
    #[cfg(not(feature = "cuda"))]
    0
}

/// `conv2d` with symmetric padding, differentiable on autodiff backends.
///
/// The convolution runs in the input's element type: a weight and bias of another type are cast
/// to it first (PyTorch's autocast rule; their gradients come back in their own type). On
/// `Autodiff<Cuda>` and `Cuda` tensors (f32, bf16, f16) it runs cuDNN when the library loads and
/// [`super::CudnnOptions::enabled`] is set; otherwise burn's kernels, with one log line.
///
/// Activations are in `layout`'s order ([`Layout::Nhwc`]: `[batch, height, width, channels]`,
/// PyTorch's channels_last); the weight is always burn's `[k, c / groups, r, s]` (cuDNN gets it
/// reordered). burn's kernels see NCHW views of channels-last tensors.
///
/// # Shapes
/// - x: `[batch, channels_in, height, width]` (NCHW)
/// - weight: `[channels_out, channels_in / groups, kernel_h, kernel_w]`
/// - bias: `[channels_out]`
/// - output: `[batch, channels_out, height_out, width_out]` (NCHW)
pub fn conv2d<B: Backend>(
    x: Tensor<B, 4>,
    weight: Tensor<B, 4>,
    bias: Option<Tensor<B, 1>>,
    options: ConvOptions<2>,
    layout: Layout,
) -> Tensor<B, 4> {
    let c_in = x.dims()[layout.channel_axis()];
    let [_, c_per_group, _, _] = weight.dims();
    assert_eq!(
        c_in,
        c_per_group * options.groups,
        "conv2d: got channels_in={c_in}, the weight expects {c_per_group} x groups={}",
        options.groups
    );
    let dtype = x.dtype();
    let bias = bias.map(|b| b.cast(dtype));
    // cuDNN casts (and reorders) the weight itself, once per forward pass.
    #[cfg(feature = "cuda")]
    let (x, weight) = match crate::nn::cuda::ops::conv::try_conv2d(x, weight, &options, layout) {
        Ok(y) => {
            return match bias {
                Some(b) => {
                    let k = b.dims()[0];
                    let mut per_channel = [1, 1, 1, 1];
                    per_channel[layout.channel_axis()] = k;
                    y + b.reshape(per_channel)
                }
                None => y,
            };
        }
        Err(inputs) => inputs,
    };
    note_path(|| "burn's kernels".into());
    layout.view_from_nchw(burn::tensor::module::conv2d(layout.view_nchw(x), weight.cast(dtype), bias, options))
}

impl<B: Backend> Conv2d<B> {
    /// The convolution through [`conv2d`] (so through cuDNN on burn-cuda), in the layer's
    /// layout, in its precision when set (else the input's type). Asymmetric or `Same` padding,
    /// which cuDNN cannot express, goes to burn-nn's forward (in f32 when the input is of
    /// another type, cast back after).
    ///
    /// # Shapes
    /// `[batch, channels_in, height, width]` → `[batch, channels_out, height_out, width_out]`,
    /// both in the layer's [`Layout`].
    pub fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        let layout = self.layout;
        let x = self.in_precision(x);
        let padding = match self.padding {
            PaddingConfig2d::Valid => [0, 0],
            PaddingConfig2d::Explicit(top, left, bottom, right) if top == bottom && left == right => [top, left],
            _ => {
                let dtype = x.dtype();
                let f32 = self.weight.val().dtype();
                return layout.view_from_nchw(self.to_burn_nn().forward(layout.view_nchw(x).cast(f32))).cast(dtype);
            }
        };
        let options = ConvOptions::new(self.stride, padding, self.dilation, self.groups);
        // Through the gradient hook when DDP overlaps its all-reduce with backward.
        let (weight, bias) = (param_val(&self.weight, &x), self.bias.as_ref().map(|b| param_val(b, &x)));
        conv2d(x, weight, bias, options, layout)
    }

    /// The layer as a patch embedding (ViT's): the output as tokens `[batch, grid_h · grid_w,
    /// channels_out]` in row-major grid order, with the grid `[grid_h, grid_w]` — what
    /// [`forward`](Self::forward) gives, reshaped, for any convolution.
    ///
    /// When the patches do not overlap (stride = kernel, no padding or dilation, one group) and
    /// `CudnnOptions::patch_gemm` is on, this is a reshape of the input into patches and one
    /// matrix product by the filter (`nn::linear`'s, on cuBLAS on burn-cuda), where cuDNN has
    /// no fast engine: a 16 × 16 stride-16 convolution of 3 channels took ~1 ms forward and
    /// ~0.7 ms backward of a ViT-B/16 bf16 b128 step on an H200 (PyTorch's the same), for what
    /// is a `[25088, 768] × [768, 768]` product. The convolution ignores rows and columns past
    /// the last whole patch; so does this.
    ///
    /// # Shapes
    /// `[batch, channels_in, height, width]` (in the layer's [`Layout`]) → `[batch, (height /
    /// kernel_h) · (width / kernel_w), channels_out]`
    pub fn forward_tokens(&self, x: Tensor<B, 4>) -> (Tensor<B, 3>, [usize; 2]) {
        let patches_apart = self.stride == self.kernel_size
            && self.dilation == [1, 1]
            && self.groups == 1
            && matches!(self.padding, PaddingConfig2d::Valid | PaddingConfig2d::Explicit(0, 0, 0, 0));
        if patches_apart && crate::nn::settings::options::get().patch_gemm {
            self.tokens_by_product(x)
        } else {
            self.tokens_by_convolution(x)
        }
    }

    /// [`forward_tokens`](Self::forward_tokens) as the convolution and a reshape.
    fn tokens_by_convolution(&self, x: Tensor<B, 4>) -> (Tensor<B, 3>, [usize; 2]) {
        let y = self.forward(x);
        match self.layout {
            Layout::Nchw => {
                let [n, k, gh, gw] = y.dims();
                (y.reshape([n, k, gh * gw]).swap_dims(1, 2), [gh, gw])
            }
            Layout::Nhwc => {
                let [n, gh, gw, k] = y.dims();
                (y.reshape([n, gh * gw, k]), [gh, gw])
            }
        }
    }

    /// [`forward_tokens`](Self::forward_tokens) of non-overlapping patches as one product.
    fn tokens_by_product(&self, x: Tensor<B, 4>) -> (Tensor<B, 3>, [usize; 2]) {
        let x = self.in_precision(x);
        // Through the gradient hook when DDP overlaps its all-reduce with backward.
        let (weight, bias) = (param_val(&self.weight, &x), self.bias.as_ref().map(|b| param_val(b, &x)));
        let (patches, grid) = patches(x, self.kernel_size, self.layout);
        let [k, c, kh, kw] = weight.dims();
        // Each patch is read in the filter's order (channel, row, column): the product is by
        // the filter as a `[c·kh·kw, k]` matrix, a transposed view of its own buffer.
        (affine(weight.reshape([k, c * kh * kw]).transpose(), bias, patches), grid)
    }

    /// `x` in the layer's precision (unchanged without one).
    fn in_precision(&self, x: Tensor<B, 4>) -> Tensor<B, 4> {
        match self.precision {
            Some(p) => x.cast(p.dtype()),
            None => x,
        }
    }
}

/// `x` (`[n, c, h, w]` in `layout`) as `[n, grid_h · grid_w, c · kh · kw]` patches of `kernel`
/// size in row-major grid order, each in (channel, row, column) order; rows and columns past
/// the last whole patch are dropped.
fn patches<B: Backend>(x: Tensor<B, 4>, kernel: [usize; 2], layout: Layout) -> (Tensor<B, 3>, [usize; 2]) {
    let [n, c, h, w] = layout.to_nchw(x.dims());
    let [kh, kw] = kernel;
    let [gh, gw] = [h / kh, w / kw];
    assert!(gh > 0 && gw > 0, "patch embedding: an image of {h}x{w} holds no {kh}x{kw} patch");
    let x = match (layout, [gh * kh, gw * kw]) {
        (_, whole) if whole == [h, w] => x,
        (Layout::Nchw, [hs, ws]) => x.slice([0..n, 0..c, 0..hs, 0..ws]),
        (Layout::Nhwc, [hs, ws]) => x.slice([0..n, 0..hs, 0..ws, 0..c]),
    };
    let grouped = match layout {
        Layout::Nchw => x.reshape([n, c, gh, kh, gw, kw]).permute([0, 2, 4, 1, 3, 5]),
        Layout::Nhwc => x.reshape([n, gh, kh, gw, kw, c]).permute([0, 1, 3, 5, 2, 4]),
    };
    (grouped.reshape([n, gh * gw, c * kh * kw]), [gh, gw])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::reference::{Conv2dCase, conv2d_f64, conv2d_grads_f64};
    use burn::module::Param;
    use burn_autodiff::Autodiff;
    use burn_flex::Flex;

    type Ad = Autodiff<Flex>;

    /// Forward, input gradient, weight gradient and bias gradient of [`conv2d`] on the CPU
    /// backend against the f64 reference, for stride, padding, dilation, groups and bias.
    #[test]
    fn matches_f64_reference_in_every_direction() {
        let device = Default::default();
        let cases = [
            Conv2dCase {
                n: 2,
                c: 3,
                h: 9,
                w: 8,
                k: 4,
                r: 3,
                s: 3,
                stride: [1, 1],
                pad: [1, 1],
                dil: [1, 1],
                groups: 1,
                bias: false,
            },
            Conv2dCase {
                n: 2,
                c: 4,
                h: 10,
                w: 7,
                k: 6,
                r: 3,
                s: 2,
                stride: [2, 1],
                pad: [1, 0],
                dil: [1, 1],
                groups: 2,
                bias: true,
            },
            Conv2dCase {
                n: 1,
                c: 2,
                h: 11,
                w: 11,
                k: 3,
                r: 3,
                s: 3,
                stride: [2, 2],
                pad: [2, 2],
                dil: [2, 2],
                groups: 1,
                bias: true,
            },
            Conv2dCase {
                n: 3,
                c: 8,
                h: 5,
                w: 5,
                k: 8,
                r: 1,
                s: 1,
                stride: [2, 2],
                pad: [0, 0],
                dil: [1, 1],
                groups: 1,
                bias: false,
            },
        ];
        for case in cases {
            let (x, w, b, g) = case.random_inputs(7);
            let xt = Tensor::<Ad, 4>::from_data(
                TensorData::new(x.iter().map(|&v| v as f32).collect(), case.x_dims()),
                &device,
            )
            .require_grad();
            let wt = Tensor::<Ad, 4>::from_data(
                TensorData::new(w.iter().map(|&v| v as f32).collect(), case.w_dims()),
                &device,
            )
            .require_grad();
            let bt =
                Tensor::<Ad, 1>::from_data(TensorData::new(b.iter().map(|&v| v as f32).collect(), [case.k]), &device)
                    .require_grad();
            let gt = Tensor::<Ad, 4>::from_data(
                TensorData::new(g.iter().map(|&v| v as f32).collect(), case.y_dims()),
                &device,
            );
            let y = conv2d(xt.clone(), wt.clone(), case.bias.then(|| bt.clone()), case.options(), Layout::Nchw);
            let grads = (y.clone() * gt).sum().backward();
            let got = |t: Vec<f32>| t.into_iter().map(f64::from).collect::<Vec<_>>();
            let y_ref = conv2d_f64(&case, &x, &w, &b);
            let (dx_ref, dw_ref, db_ref) = conv2d_grads_f64(&case, &x, &w, &g);
            let check = |what: &str, got: &[f64], want: &[f64]| {
                let err = crate::nn::reference::max_rel_err(got, want);
                assert!(err < 1e-5, "{what} of {case:?}: relative error {err}");
            };
            check("output", &got(y.into_data().to_vec().unwrap()), &y_ref);
            check("input gradient", &got(xt.grad(&grads).unwrap().into_data().to_vec().unwrap()), &dx_ref);
            check("weight gradient", &got(wt.grad(&grads).unwrap().into_data().to_vec().unwrap()), &dw_ref);
            if case.bias {
                check("bias gradient", &got(bt.grad(&grads).unwrap().into_data().to_vec().unwrap()), &db_ref);
            }
        }
    }

    /// A patch embedding's tokens, by the product and by the convolution, against the f64
    /// convolution (values and the gradients of the input, filter and bias), in both layouts,
    /// for square and oblong patches and for an image with rows and columns past the last
    /// whole patch (dropped, as by the convolution).
    #[test]
    fn patch_tokens_match_the_f64_convolution() {
        let device = Default::default();
        let cases = [
            Conv2dCase::patches(3, [8, 12], 5, [4, 4], true),
            Conv2dCase::patches(2, [9, 7], 4, [2, 3], false),
            Conv2dCase::patches(4, [6, 6], 6, [3, 3], true),
        ];
        let tensor = |v: &[f64], dims: [usize; 4]| {
            Tensor::<Ad, 4>::from_data(TensorData::new(v.iter().map(|&v| v as f32).collect(), dims), &device)
        };
        for (case, layout) in cases.into_iter().flat_map(|c| [(c, Layout::Nchw), (c, Layout::Nhwc)]) {
            let (x, w, b, g) = case.random_inputs(11);
            let [gh, gw] = case.out_hw();
            // The tokens' gradient: g's values at token (row-major grid position), channel.
            let g_tokens = tensor(&g, case.y_dims()).reshape([case.n, case.k, gh * gw]).swap_dims(1, 2);
            let y_ref = conv2d_f64(&case, &x, &w, &b);
            let (dx_ref, dw_ref, db_ref) = conv2d_grads_f64(&case, &x, &w, &g);
            let want_tokens: Vec<f64> = (0..case.n * gh * gw * case.k)
                .map(|i| {
                    let (n, p, k) = (i / (gh * gw * case.k), i / case.k % (gh * gw), i % case.k);
                    y_ref[(n * case.k + k) * gh * gw + p]
                })
                .collect();
            for by_product in [true, false] {
                let layer = Conv2d {
                    weight: Param::from_tensor(tensor(&w, case.w_dims())),
                    bias: case.bias.then(|| {
                        Param::from_tensor(Tensor::from_data(
                            TensorData::new(b.iter().map(|&v| v as f32).collect(), [case.k]),
                            &device,
                        ))
                    }),
                    stride: case.stride,
                    kernel_size: [case.r, case.s],
                    dilation: [1, 1],
                    groups: 1,
                    padding: PaddingConfig2d::Valid,
                    layout,
                    precision: None,
                };
                let xt = tensor(&x, case.x_dims()).require_grad();
                let input = layout.view_from_nchw(xt.clone());
                let (tokens, grid) =
                    if by_product { layer.tokens_by_product(input) } else { layer.tokens_by_convolution(input) };
                assert_eq!(grid, [gh, gw]);
                let grads = (tokens.clone() * g_tokens.clone()).sum().backward();
                let what = format!("{case:?} {layout:?} by_product={by_product}");
                let got = |t: TensorData| t.to_vec::<f32>().unwrap().into_iter().map(f64::from).collect::<Vec<_>>();
                let check = |name: &str, got: &[f64], want: &[f64]| {
                    let err = crate::nn::reference::max_rel_err(got, want);
                    assert!(err < 1e-5, "{name} of {what}: relative error {err}");
                };
                check("tokens", &got(tokens.into_data()), &want_tokens);
                check("input gradient", &got(xt.grad(&grads).unwrap().into_data()), &dx_ref);
                check("filter gradient", &got(layer.weight.val().grad(&grads).unwrap().into_data()), &dw_ref);
                if let Some(bias) = &layer.bias {
                    check("bias gradient", &got(bias.val().grad(&grads).unwrap().into_data()), &db_ref);
                }
            }
        }
    }

    #[test]
    fn module_forward_goes_through_the_same_op() {
        let device = Default::default();
        for padding in
            [PaddingConfig2d::Explicit(1, 1, 1, 1), PaddingConfig2d::Explicit(1, 0, 2, 1), PaddingConfig2d::Same]
        {
            let theirs =
                burn_nn::conv::Conv2dConfig::new([3, 5], [3, 3]).with_padding(padding.clone()).init::<Flex>(&device);
            // Parameters initialise lazily, and each clone on its own: draw them first.
            let _ = (theirs.weight.val(), theirs.bias.as_ref().map(|b| b.val()));
            let mine = Conv2d::from(theirs.clone());
            let x = Tensor::<Flex, 4>::random([2, 3, 6, 6], burn::tensor::Distribution::Normal(0.0, 1.0), &device);
            let want = theirs.forward(x.clone()).into_data();
            assert_eq!(
                mine.forward(x.clone()).into_data().to_vec::<f32>().unwrap(),
                want.to_vec::<f32>().unwrap(),
                "{padding:?}"
            );
            // Channels-last: the same values in NHWC order.
            let nhwc = mine.with_layout(Layout::Nhwc).forward(x.permute([0, 2, 3, 1])).permute([0, 3, 1, 2]);
            nhwc.into_data().assert_approx_eq::<f32>(&want, burn::tensor::Tolerance::default());
        }
    }
}
