//! Datasets, the seeded per-class split, transforms and the parallel prefetching loader.

pub mod augment;
pub mod decode;
pub mod folder;
pub mod idx;
pub mod loader;
pub mod rand_augment;
pub mod shards;
pub mod source;
pub mod split;
pub mod throughput;
pub mod transform;

pub use augment::Augment;
pub use decode::Decode;
pub use folder::FolderDataset;
pub use idx::IdxDataset;
pub use loader::{Batch, BatchImages, Loader, LoaderConfig, SkipLog, StageTimes};
pub use shards::ShardDataset;
pub use source::{DataSource, load_source, load_source_with};
pub use split::{shuffle_for_epoch, split_per_class};
pub use throughput::{BatchSink, DataBenchConfig, DataBenchResult, HostMemory, loader_throughput};
pub use transform::{Pipeline, Step};

use crate::error::Result;
use image::DynamicImage;
use std::ops::Range;

/// A labelled image collection read by index. Implementations must be cheap to share across
/// the loader's threads.
pub trait Dataset: Send + Sync {
    /// Number of samples.
    fn len(&self) -> usize;
    /// True when there are no samples.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// The class index of sample `index`, known without decoding it.
    fn label(&self, index: usize) -> usize;
    /// Decodes sample `index`.
    ///
    /// # Errors
    /// When the underlying file is missing, unreadable or not a decodable image.
    fn load(&self, index: usize) -> Result<DynamicImage>;
    /// The encoded bytes of sample `index` (its file as stored), for decoders elsewhere than
    /// [`Dataset::load`] (the GPU's); `None` (the default) for data without files per sample.
    fn read_bytes(&self, index: usize) -> Option<Result<Vec<u8>>> {
        let _ = index;
        None
    }
    /// A human-readable name of sample `index` (its path, or `file#index`).
    fn describe(&self, index: usize) -> String;
    /// Class names, indexed by label.
    fn classes(&self) -> &[String];
    /// For data read front to back (tar shards): the samples of each shard, as index ranges in
    /// reading order. `None` (the default) for data read in any order.
    fn shards(&self) -> Option<&[Range<usize>]> {
        None
    }
}
