//! The drop-in modules' data: [`Conv2d`] and [`BatchNorm`] hold burn-nn's parameters, buffers
//! and field names (so records, checkpoints and weight-file keys are burn-nn's) plus two
//! settings, the activations' [`Layout`] and [`Precision`]. Their forward passes live with the
//! operations (`conv.rs`, `batch_norm.rs`); this file imports none of them, so the operations
//! may name these types without an import cycle.

use crate::nn::settings::layout::Layout;
use crate::nn::settings::precision::Precision;
use burn::module::{Param, RunningState};
use burn::prelude::*;
use burn_nn::PaddingConfig2d;

/// A 2-D convolution with burn-nn's parameters that runs on cuDNN on burn-cuda (forward and
/// both gradients) and burn's kernels elsewhere. Build it from burn-nn's config:
/// `Conv2d::from(Conv2dConfig::new([3, 64], [3, 3]).init(&device))`.
#[derive(Module, Debug)]
pub struct Conv2d<B: Backend> {
    /// `[channels_out, channels_in / groups, kernel_h, kernel_w]`, f32.
    pub weight: Param<Tensor<B, 4>>,
    /// `[channels_out]`.
    pub bias: Option<Param<Tensor<B, 1>>>,
    /// Stride (height, width).
    pub stride: [usize; 2],
    /// Kernel size (height, width).
    pub kernel_size: [usize; 2],
    /// Dilation (height, width).
    pub dilation: [usize; 2],
    /// Groups.
    pub groups: usize,
    /// Padding (cuDNN takes symmetric padding; other kinds run burn-nn's own forward).
    pub padding: PaddingConfig2d,
    /// The activations' memory order (a setting: not saved in records).
    pub layout: Layout,
    /// When set, the input is cast to this type first (autocast at the layer); otherwise the
    /// convolution runs in the input's type. Not saved in records.
    pub precision: Option<Precision>,
}

/// BatchNorm with burn-nn's parameters and running statistics (`gamma`, `beta`,
/// `running_mean`, `running_var`, all f32), optionally fused with the ReLU after it; cuDNN
/// (NCHW) or our own CUDA kernels (channels-last) on burn-cuda, burn's operations elsewhere.
/// Build it from burn-nn's config: `BatchNorm::from(BatchNormConfig::new(64).init(&device))`.
#[derive(Module, Debug)]
pub struct BatchNorm<B: Backend> {
    /// Scale, `[channels]`.
    pub gamma: Param<Tensor<B, 1>>,
    /// Shift, `[channels]`.
    pub beta: Param<Tensor<B, 1>>,
    /// Running mean, `[channels]`.
    pub running_mean: RunningState<Tensor<B, 1>>,
    /// Running (biased) variance, `[channels]`.
    pub running_var: RunningState<Tensor<B, 1>>,
    /// Weight of the batch statistics in the running ones.
    pub momentum: f64,
    /// Added to the variance.
    pub epsilon: f64,
    /// The activations' memory order (a setting: not saved in records).
    pub layout: Layout,
    /// When set, the input is cast to this type first; otherwise the output has the input's
    /// type. Statistics and arithmetic are f32 either way. Not saved in records.
    pub precision: Option<Precision>,
}

impl<B: Backend> From<burn_nn::conv::Conv2d<B>> for Conv2d<B> {
    fn from(c: burn_nn::conv::Conv2d<B>) -> Self {
        Self {
            weight: c.weight,
            bias: c.bias,
            stride: c.stride,
            kernel_size: c.kernel_size,
            dilation: c.dilation,
            groups: c.groups,
            padding: c.padding,
            layout: Layout::Nchw,
            precision: None,
        }
    }
}

impl<B: Backend> From<burn_nn::BatchNorm<B>> for BatchNorm<B> {
    fn from(b: burn_nn::BatchNorm<B>) -> Self {
        Self {
            gamma: b.gamma,
            beta: b.beta,
            running_mean: b.running_mean,
            running_var: b.running_var,
            momentum: b.momentum,
            epsilon: b.epsilon,
            layout: Layout::Nchw,
            precision: None,
        }
    }
}

impl<B: Backend> Conv2d<B> {
    /// The same layer with activations in `layout`'s order.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The same layer casting its input to `precision` (`None`: the input's type).
    pub fn with_precision(mut self, precision: Option<Precision>) -> Self {
        self.precision = precision;
        self
    }

    /// burn-nn's module over the same parameters (for its own forward). The parameters are
    /// read, not cloned: a clone of a not-yet-initialised parameter would initialise on its own.
    pub fn to_burn_nn(&self) -> burn_nn::conv::Conv2d<B> {
        burn_nn::conv::Conv2d {
            weight: Param::initialized(self.weight.id, self.weight.val()),
            bias: self.bias.as_ref().map(|b| Param::initialized(b.id, b.val())),
            stride: self.stride,
            kernel_size: self.kernel_size,
            dilation: self.dilation,
            groups: self.groups,
            padding: self.padding.clone(),
        }
    }
}

impl<B: Backend> BatchNorm<B> {
    /// The same layer with activations in `layout`'s order.
    pub fn with_layout(mut self, layout: Layout) -> Self {
        self.layout = layout;
        self
    }

    /// The same layer casting its input to `precision` (`None`: the input's type).
    pub fn with_precision(mut self, precision: Option<Precision>) -> Self {
        self.precision = precision;
        self
    }

    /// Burn's BatchNorm update of the running statistics from a batch's mean and biased
    /// variance (`[channels]` each): a momentum blend, outside the autodiff graph.
    pub(crate) fn update_running(&self, mean: Tensor<B, 1>, var: Tensor<B, 1>) {
        let (m, device) = (self.momentum, mean.device());
        let blend = |running: Tensor<B, 1>, batch: Tensor<B, 1>| {
            (running.to_device(&device) * (1.0 - m) + batch.detach() * m).detach()
        };
        self.running_mean.update(blend(self.running_mean.value_sync(), mean));
        self.running_var.update(blend(self.running_var.value_sync(), var));
    }

    /// burn-nn's module over the same parameters and the same running statistics (updates
    /// through it reach this layer: burn's `RunningState` is shared between clones). The
    /// parameters are read, not cloned: a clone of a not-yet-initialised parameter would
    /// initialise on its own, and its gradient would not reach this layer.
    pub fn to_burn_nn(&self) -> burn_nn::BatchNorm<B> {
        burn_nn::BatchNorm {
            gamma: Param::initialized(self.gamma.id, self.gamma.val()),
            beta: Param::initialized(self.beta.id, self.beta.val()),
            running_mean: self.running_mean.clone(),
            running_var: self.running_var.clone(),
            momentum: self.momentum,
            epsilon: self.epsilon,
        }
    }
}

/// What follows a batch norm's normalisation in the same pass (the channels-last kernels and
/// their fallback on burn's operations).
#[derive(Clone, Debug)]
pub(crate) enum Epilogue<T> {
    /// `bn(x)`.
    None,
    /// `relu(bn(x))`.
    Relu,
    /// `relu(bn(x) + residual)`: a residual block's end; `residual` has `x`'s shape and type.
    AddRelu(T),
}

// Read by the CUDA operations (and their fallback there) only.
#[cfg_attr(not(feature = "cuda"), allow(dead_code))]
impl<T> Epilogue<T> {
    /// Whether the pass ends with a ReLU.
    pub(crate) fn relu(&self) -> bool {
        !matches!(self, Epilogue::None)
    }

    /// The same epilogue over `f` of its residual.
    pub(crate) fn map<U>(self, f: impl FnOnce(T) -> U) -> Epilogue<U> {
        match self {
            Epilogue::None => Epilogue::None,
            Epilogue::Relu => Epilogue::Relu,
            Epilogue::AddRelu(t) => Epilogue::AddRelu(f(t)),
        }
    }

    /// The residual, when there is one.
    pub(crate) fn residual(self) -> Option<T> {
        match self {
            Epilogue::AddRelu(t) => Some(t),
            _ => None,
        }
    }
}
