//! The vocabulary shared by the cuDNN FFI files (`cuda::cudnn::convolution`, `cuda::cudnn::conv_graph`, `cuda::cudnn::batch_norm`) and the
//! stream plumbing: element types, a convolution's geometry, its device addresses, and how a
//! failed call becomes an [`Error`]. Plain data and raw pointers only.

use crate::error::Error;
use crate::nn::settings::layout::Layout;
use cudarc::cudnn::sys;

/// The element type of the tensors cuDNN reads and writes. Arithmetic is f32 for all three
/// (products accumulate in f32, as PyTorch configures cuDNN for half types); batch-norm
/// parameters and statistics are always f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DataType {
    /// 32-bit float (tensor cores in TF32 when [`super::CudnnOptions::allow_tf32`]).
    F32,
    /// bfloat16.
    Bf16,
    /// IEEE half.
    F16,
}

impl DataType {
    /// Bytes per element.
    pub(crate) fn size(self) -> usize {
        match self {
            DataType::F32 => 4,
            DataType::Bf16 | DataType::F16 => 2,
        }
    }

    pub(crate) fn raw(self) -> sys::cudnnDataType_t {
        match self {
            DataType::F32 => sys::cudnnDataType_t::CUDNN_DATA_FLOAT,
            DataType::Bf16 => sys::cudnnDataType_t::CUDNN_DATA_BFLOAT16,
            DataType::F16 => sys::cudnnDataType_t::CUDNN_DATA_HALF,
        }
    }
}

/// The geometry of one convolution, in cuDNN's terms (dims in NCHW order, strides in elements,
/// filter dims `[k, c / groups, r, s]`).
///
/// `x` is the input (or, backward-data, the input gradient), `y` the output (or its gradient).
/// Both may be strided (burn-cuda pitches rows; channels-last tensors have NHWC strides); the
/// filter is always packed, in KCRS order for [`Layout::Nchw`] and KRSC for [`Layout::Nhwc`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct ConvShape {
    /// Element type of input, filter and output (all three the same).
    pub dtype: DataType,
    /// Memory order of the filter (the activations' order is in their strides).
    pub layout: Layout,
    /// Input dims `[n, c, h, w]`.
    pub x: [i32; 4],
    /// Input strides.
    pub x_strides: [i32; 4],
    /// Filter dims `[k, c / groups, r, s]`.
    pub w: [i32; 4],
    /// Output dims `[n, k, p, q]`.
    pub y: [i32; 4],
    /// Output strides.
    pub y_strides: [i32; 4],
    /// Zero padding (height, width), the same on both sides.
    pub pad: [i32; 2],
    /// Stride (height, width).
    pub stride: [i32; 2],
    /// Dilation (height, width).
    pub dilation: [i32; 2],
    /// Groups.
    pub groups: i32,
}

/// Which of the three convolution computations to run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// `y = conv(x, w)`.
    Forward,
    /// `dx = conv_transpose(dy, w)`.
    BackwardData,
    /// `dx += conv_transpose(dy, w)`: backward-data adding into the gradient already in `dx`
    /// (β = 1), for an input that feeds several convolutions.
    BackwardDataAccumulate,
    /// `dw = corr(x, dy)`.
    BackwardFilter,
}

impl Direction {
    /// cuDNN's β: how much of the output buffer's old contents the result is added to.
    pub(crate) fn beta(self) -> f32 {
        if self == Direction::BackwardDataAccumulate { 1.0 } else { 0.0 }
    }
}

/// Device addresses of one call. Which are read and which written depends on the direction:
/// forward writes `y`, backward-data writes `x`, backward-filter writes `w`.
#[derive(Clone, Copy, Debug)]
pub struct Pointers {
    /// Input or input gradient.
    pub x: u64,
    /// Filter or filter gradient.
    pub w: u64,
    /// Output or output gradient.
    pub y: u64,
}

pub(crate) fn fail(op: &'static str, e: impl std::fmt::Debug) -> Error {
    Error::Cudnn { op, reason: format!("{e:?}") }
}
