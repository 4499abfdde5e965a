//! The one abstraction the pipeline (training, evaluation, prediction, `bench`, checkpoints)
//! knows a model family by. Each family implements it in its own file; `Classifier` (the enum
//! over the families) implements it by dispatch.

use burn::prelude::*;
use burn_ddp::BatchNormSync;
use burn_ddp::nn::{Layout, Precision};

/// A PyTorch naming scheme: its name and `(regex on our path, replacement)` rewrites.
pub type NameScheme = (&'static str, &'static [(&'static str, &'static str)]);

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
    /// The PyTorch naming schemes of this family (timm's, torchvision's), the export default
    /// first: each a name and the rewrites from our parameter paths to its names beyond the
    /// conventions `weights` applies to every family — `(regex, replacement)` pairs applied in
    /// order. Import picks the scheme that fits the file.
    fn torch_names(&self) -> &'static [NameScheme];
    /// Our paths of the classifier head's parameters (re-initialised when a weight file has
    /// another class count), and the parameters `--freeze-layers` leaves trainable.
    fn head_params(&self) -> Vec<String>;
    /// Stochastic depth at `rate` for the deepest block (timm's `drop_path_rate`), or `None`
    /// when the family has none (the caller reports it).
    fn with_drop_path(self, rate: f64) -> Option<Self>
    where
        Self: Sized,
    {
        (rate == 0.0).then_some(self)
    }
    /// The key of the next training step's random draws (stochastic depth): a pure function of
    /// seed, epoch, step and rank, so a resumed run draws as the uninterrupted one.
    fn set_draw_key(&self, _key: u64) {}
}
