//! 2-D convolution that takes the fastest path the backend has: cuDNN on burn-cuda (forward and
//! both gradients, with `feature = "cuda"`), burn's own kernels everywhere else.

use super::Layout;
use crate::grad_ready::param_val;
use crate::nn::layers::Conv2d;
use crate::nn::runtime::report::note_path;
use burn::prelude::*;
use burn::tensor::ops::ConvOptions;
use burn_nn::PaddingConfig2d;

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
        let x = match self.precision {
            Some(p) => x.cast(p.dtype()),
            None => x,
        };
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
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::nn::reference::{Conv2dCase, conv2d_f64, conv2d_grads_f64};
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
