//! The one abstraction the pipeline (training, evaluation, prediction, `bench`, checkpoints)
//! knows a model family by. Each family implements it in its own file; `Classifier` (the enum
//! over the families) implements it by dispatch.

use burn::prelude::*;
use burn_ddp::BatchNormSync;
use burn_ddp::nn::{Layout, Precision};

/// What the pipeline needs of an image classifier.
pub trait ImageClassifier<B: Backend>: Sized {
    /// Class logits, f32 whatever the precision.
    ///
    /// # Shapes
    /// `[n, in_channels, h, w]` (NCHW) → `[n, num_classes]`
    fn forward(&self, x: Tensor<B, 4>) -> Tensor<B, 2>;
    /// Activations in `precision` (PyTorch's autocast as a model setting); parameters stay f32.
    fn with_precision(self, precision: Precision) -> Self;
    /// The activations' precision.
    fn precision(&self) -> Precision;
    /// Channels-last activations inside the model (input and output keep their shapes).
    fn with_channels_last(self, channels_last: bool) -> Self;
    /// The activations' memory order.
    fn layout(&self) -> Layout;
    /// BatchNorm statistics over every rank of `sync`'s group; a family without BatchNorm
    /// ignores it (and says so in [`ImageClassifier::sync_batch_norm`]).
    fn with_sync_batch_norm(self, sync: Option<BatchNormSync>) -> Self;
    /// Whether batch norms are synchronised across ranks.
    fn sync_batch_norm(&self) -> bool;
    /// Where PyTorch's names of this family (torchvision's, timm's) differ from ours beyond
    /// the conventions `weights` applies to every family: `(ours, theirs)` substrings of
    /// parameter paths.
    fn torch_renames(&self) -> &'static [(&'static str, &'static str)];
    /// Our paths of the classifier head's parameters (re-initialised when a weight file has
    /// another class count), and the parameters `--freeze-layers` leaves trainable.
    fn head_params(&self) -> Vec<String>;
}
