//! Resolves `--data` (`bundled`, `fashion-mnist`, a class folder, or tar shards) into a dataset
//! and the transforms that suit it.

use super::Dataset;
use super::idx::FASHION_MNIST_CLASSES;
use crate::data::augment::Augment;
use crate::data::folder::FolderDataset;
use crate::data::idx::IdxDataset;
use crate::data::shards::{ShardDataset, is_shard_spec};
use crate::data::transform::Pipeline;
use crate::error::{Error, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The bundled Fashion-MNIST subset (MIT licence): the first 1,000 training images of each
/// class, made by `cargo xtask data bundle` from Debian's `dataset-fashion-mnist`.
pub const BUNDLED_IMAGES: &[u8] = include_bytes!("../../../datasets/fashion-mnist-10k/images-idx3-ubyte.gz");
/// Labels of [`BUNDLED_IMAGES`].
pub const BUNDLED_LABELS: &[u8] = include_bytes!("../../../datasets/fashion-mnist-10k/labels-idx1-ubyte.gz");

/// Fashion-MNIST's pixel mean and standard deviation (training set, scaled to `[0, 1]`).
pub const FASHION_MNIST_MEAN_STD: (f32, f32) = (0.2860, 0.3530);

/// Where the data comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DataSource {
    /// The Fashion-MNIST subset compiled into the binary.
    Bundled,
    /// The full Fashion-MNIST training set (60k) from `datasets/fashion-mnist/` or Debian's
    /// package path.
    FashionMnist,
    /// A class-folder tree (flower_photos layout).
    Folder(PathBuf),
    /// WebDataset tar shards: a `.tar` file, a brace range (`shard-{000000..000099}.tar`) or
    /// a folder of `.tar` files.
    Shards(String),
}

impl std::str::FromStr for DataSource {
    type Err = std::convert::Infallible;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        Ok(match s {
            "bundled" => DataSource::Bundled,
            "fashion-mnist" => DataSource::FashionMnist,
            shards if is_shard_spec(shards) => DataSource::Shards(shards.to_string()),
            other => DataSource::Folder(PathBuf::from(other)),
        })
    }
}

impl std::fmt::Display for DataSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            DataSource::Bundled => write!(f, "bundled"),
            DataSource::FashionMnist => write!(f, "fashion-mnist"),
            DataSource::Folder(p) => write!(f, "{}", p.display()),
            DataSource::Shards(spec) => write!(f, "{spec}"),
        }
    }
}

/// A dataset together with its default train and evaluation pipelines.
#[derive(Clone)]
pub struct LoadedData {
    /// All samples (train and validation are index subsets of it).
    pub dataset: Arc<dyn Dataset>,
    /// Augmenting transforms for training.
    pub train: Pipeline,
    /// Deterministic transforms for validation and prediction.
    pub eval: Pipeline,
}

/// Folders searched, in order, for the full Fashion-MNIST files.
pub fn fashion_mnist_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::var_os("BURN_VISION_FASHION_MNIST") {
        dirs.push(PathBuf::from(dir));
    }
    dirs.push(PathBuf::from("datasets/fashion-mnist"));
    dirs.push(PathBuf::from("/usr/share/datasets/fashion-mnist"));
    dirs
}

fn classes() -> Vec<String> {
    FASHION_MNIST_CLASSES.iter().map(|s| s.to_string()).collect()
}

/// The grayscale pipelines used for MNIST-like data: padding to `size`, `aug`'s random steps in
/// training.
pub fn grayscale_pipelines(size: u32, aug: &Augment) -> (Pipeline, Pipeline) {
    let (mean, std) = FASHION_MNIST_MEAN_STD;
    let train = Pipeline::grayscale(size, mean, std, aug);
    (train.clone(), train.deterministic())
}

/// Loads `source`. `image_size` is the side of the model's input for folder data
/// (RandomResizedCrop / Resize+CenterCrop); IDX data keeps its 28×28.
///
/// # Errors
/// When the folder is missing or malformed, or Fashion-MNIST is not found (the message says how
/// to get it).
pub fn load_source(source: &DataSource, image_size: u32) -> Result<LoadedData> {
    load_source_with(source, image_size, &Augment::default())
}

/// [`load_source`] with the training augmentation `aug`.
///
/// # Errors
/// As [`load_source`].
pub fn load_source_with(source: &DataSource, image_size: u32, aug: &Augment) -> Result<LoadedData> {
    match source {
        DataSource::Bundled => {
            let ds = IdxDataset::from_bytes(BUNDLED_IMAGES, BUNDLED_LABELS, "bundled-fashion-mnist", classes())?;
            idx_data(ds, aug)
        }
        DataSource::FashionMnist => {
            let dir = fashion_mnist_dirs()
                .into_iter()
                .find(|d| d.join("train-images-idx3-ubyte.gz").is_file())
                .ok_or_else(|| Error::MissingDataDir { path: PathBuf::from("datasets/fashion-mnist (run `cargo xtask data fashion-mnist`, or `apt-get install dataset-fashion-mnist`)") })?;
            let ds = IdxDataset::open(
                &dir.join("train-images-idx3-ubyte.gz"),
                &dir.join("train-labels-idx1-ubyte.gz"),
                classes(),
            )?;
            idx_data(ds, aug)
        }
        DataSource::Folder(path) => folder_data(path, image_size, aug),
        DataSource::Shards(spec) => Ok(LoadedData {
            dataset: Arc::new(ShardDataset::open(spec)?),
            train: Pipeline::imagenet_train_with(image_size, aug),
            eval: Pipeline::imagenet_eval(image_size),
        }),
    }
}

fn idx_data(ds: IdxDataset, aug: &Augment) -> Result<LoadedData> {
    let (h, w) = ds.image_size();
    let (train, eval) = grayscale_pipelines(h.max(w) as u32, aug);
    Ok(LoadedData { dataset: Arc::new(ds), train, eval })
}

fn folder_data(path: &Path, image_size: u32, aug: &Augment) -> Result<LoadedData> {
    let ds = FolderDataset::open(path)?;
    Ok(LoadedData {
        dataset: Arc::new(ds),
        train: Pipeline::imagenet_train_with(image_size, aug),
        eval: Pipeline::imagenet_eval(image_size),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundled_is_balanced_fashion_mnist() {
        let data = load_source(&DataSource::Bundled, 28).unwrap();
        let ds = &data.dataset;
        assert_eq!(ds.len(), 10_000);
        assert_eq!(ds.classes().len(), 10);
        let mut counts = [0usize; 10];
        for i in 0..ds.len() {
            counts[ds.label(i)] += 1;
        }
        assert_eq!(counts, [1000; 10]);
        assert_eq!(ds.load(0).unwrap().width(), 28);
    }

    #[test]
    fn parses_names() {
        assert_eq!("bundled".parse::<DataSource>().unwrap(), DataSource::Bundled);
        assert_eq!("x/y".parse::<DataSource>().unwrap(), DataSource::Folder("x/y".into()));
        let shards = "s/shard-{000000..000009}.tar";
        assert_eq!(shards.parse::<DataSource>().unwrap(), DataSource::Shards(shards.into()));
        assert_eq!(shards.parse::<DataSource>().unwrap().to_string(), shards);
    }
}
