//! Memory order of 4-D activations. A model in [`Layout::Nhwc`] keeps its activations as
//! `[batch, height, width, channels]` tensors (PyTorch's `channels_last`): cuDNN's fastest
//! convolution and batch-norm kernels for half types read and write that order directly, while
//! NCHW makes cuDNN transpose around every call.

use burn::prelude::*;

/// Memory order of 4-D activations (and of convolution filters on the cuDNN path).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Layout {
    /// `[batch, channels, height, width]`; filters `[k, c, r, s]`.
    #[default]
    Nchw,
    /// `[batch, height, width, channels]`; filters (as cuDNN reads them) `[k, r, s, c]`.
    Nhwc,
}

impl Layout {
    /// Index of the channel axis.
    pub fn channel_axis(self) -> usize {
        match self {
            Layout::Nchw => 1,
            Layout::Nhwc => 3,
        }
    }

    /// `(n, c, h, w)` from dims in this layout (filters: `(k, c, r, s)`).
    pub fn to_nchw<T: Copy>(self, d: [T; 4]) -> [T; 4] {
        match self {
            Layout::Nchw => d,
            Layout::Nhwc => [d[0], d[3], d[1], d[2]],
        }
    }

    /// Dims in this layout from `(n, c, h, w)`.
    pub fn from_nchw<T: Copy>(self, d: [T; 4]) -> [T; 4] {
        match self {
            Layout::Nchw => d,
            Layout::Nhwc => [d[0], d[2], d[3], d[1]],
        }
    }

    /// Element strides, in `(n, c, h, w)` order, of a packed tensor of NCHW dims `d` stored in
    /// this layout.
    pub fn strides(self, d: [i32; 4]) -> [i32; 4] {
        let [_, c, h, w] = d;
        match self {
            Layout::Nchw => [c * h * w, h * w, w, 1],
            Layout::Nhwc => [h * w * c, 1, w * c, c],
        }
    }

    /// A tensor in this layout viewed as NCHW (a permutation, no copy).
    pub fn view_nchw<B: Backend>(self, t: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Layout::Nchw => t,
            Layout::Nhwc => t.permute([0, 3, 1, 2]),
        }
    }

    /// An NCHW tensor viewed in this layout (a permutation, no copy).
    pub fn view_from_nchw<B: Backend>(self, t: Tensor<B, 4>) -> Tensor<B, 4> {
        match self {
            Layout::Nchw => t,
            Layout::Nhwc => t.permute([0, 2, 3, 1]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use burn_flex::Flex;

    #[test]
    fn dims_strides_and_views_agree() {
        let l = Layout::Nhwc;
        assert_eq!(l.to_nchw([2, 5, 7, 3]), [2, 3, 5, 7]);
        assert_eq!(l.from_nchw([2, 3, 5, 7]), [2, 5, 7, 3]);
        assert_eq!(l.strides([2, 3, 5, 7]), [105, 1, 21, 3]);
        assert_eq!(Layout::Nchw.strides([2, 3, 5, 7]), [105, 35, 7, 1]);
        // Element (n=1, c=2, h=3, w=4) of an NHWC buffer sits at the NHWC strides' offset.
        let device = Default::default();
        let t = Tensor::<Flex, 1, Int>::arange(0..210, &device).float().reshape([2, 5, 7, 3]);
        let v = l.view_nchw(t).slice([1..2, 2..3, 3..4, 4..5]).into_scalar();
        let s = l.strides([2, 3, 5, 7]);
        assert_eq!(v as i32, s[0] + 2 * s[1] + 3 * s[2] + 4 * s[3]);
        assert_eq!(l.view_from_nchw(l.view_nchw(Tensor::<Flex, 4>::zeros([2, 5, 7, 3], &device))).dims(), [2, 5, 7, 3]);
    }
}
