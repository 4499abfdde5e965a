//! The error type of burn-vision: every fallible data, checkpoint and device operation returns it.

use std::path::PathBuf;

/// Everything that can go wrong in burn-vision, with the offending values kept.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A file or folder could not be read or written.
    #[error("{action} {path}: {source}")]
    Io {
        /// What was being done ("reading", "writing", ...).
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The data folder does not exist.
    #[error(
        "data folder {path} does not exist; pass --data with a folder holding one sub-folder per class, or `bundled` / `fashion-mnist`"
    )]
    MissingDataDir {
        /// The folder asked for.
        path: PathBuf,
    },
    /// A class folder holds no readable image files.
    #[error("class folder {path} holds no .jpg/.jpeg/.png files; remove it or add images")]
    EmptyClass {
        /// The class folder.
        path: PathBuf,
    },
    /// The data folder holds no class folders at all.
    #[error("{path} holds no class sub-folders; expected DIR/CLASS_NAME/*.jpg")]
    NoClasses {
        /// The folder.
        path: PathBuf,
    },
    /// A tar shard is missing, truncated or holds a malformed sample.
    #[error("shard {path}: {reason}")]
    BadShard {
        /// The shard (or the spec naming shards).
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// An IDX file is malformed.
    #[error("{path} is not a valid IDX file: {reason}")]
    BadIdx {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// An image could not be decoded.
    #[error("cannot decode image {path}: {reason}")]
    BadImage {
        /// The image file.
        path: PathBuf,
        /// The decoder's message.
        reason: String,
    },
    /// A PyTorch weight file is missing, unreadable, or does not fit the model; or an export
    /// failed.
    #[error("weights {path}: {reason}")]
    Weights {
        /// The weight file.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// Training curves could not be read or drawn.
    #[error("plot {path}: {reason}")]
    Plot {
        /// The run folder or image concerned.
        path: PathBuf,
        /// What is wrong and what to do.
        reason: String,
    },
    /// A checkpoint is missing, truncated, corrupt or for another model.
    #[error("checkpoint {path} is unusable: {reason}")]
    BadCheckpoint {
        /// The checkpoint file.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A model name not in the registry.
    #[error("unknown model `{name}`; available: {available}")]
    UnknownModel {
        /// The name asked for.
        name: String,
        /// The registry's names, comma separated.
        available: String,
    },
    /// A GPU id that does not exist, or GPUs without the CUDA build.
    #[error("{reason}")]
    Device {
        /// What is wrong and what exists.
        reason: String,
    },
    /// A configuration value out of range.
    #[error("invalid setting {name}={value}: {reason}")]
    InvalidConfig {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: String,
        /// Why it is refused.
        reason: String,
    },
    /// A distributed-runtime or GPU-layer error (burn-ddp).
    #[error(transparent)]
    Distributed(#[from] burn_ddp::Error),
}

impl Error {
    /// An I/O error while `action`-ing `path`.
    pub fn io(action: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        Error::Io { action, path: path.into(), source }
    }
}

/// Result with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;
