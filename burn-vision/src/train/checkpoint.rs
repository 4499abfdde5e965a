//! Checkpoints: one file holding JSON metadata, the model record and the optimizer record,
//! checksummed, and written atomically (temp file, fsync, rename) so a crash never leaves a
//! half-written checkpoint behind.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

const MAGIC: &[u8; 8] = b"BVCKPT01";

/// What a checkpoint says about itself and the run that wrote it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct CheckpointMeta {
    /// Registry name of the model.
    pub model: String,
    /// Class names, by label.
    pub classes: Vec<String>,
    /// Model input channels.
    pub in_channels: usize,
    /// Whether the small-input stem is used.
    pub small_input: bool,
    /// Side length of the model input (for prediction transforms).
    pub image_size: u32,
    /// Epochs completed.
    pub epoch: usize,
    /// Optimisation steps completed.
    pub step: usize,
    /// Best validation top-1 so far.
    pub best_acc: f64,
    /// Validation top-1 of this epoch.
    pub val_acc: f64,
    /// The training configuration, as JSON, for `--resume` consistency checks.
    pub config: serde_json::Value,
    /// Training forward passes every BatchNorm has seen, the pretrained file's included
    /// (PyTorch's `num_batches_tracked`, written by `export`); absent in older checkpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches_tracked: Option<i64>,
    /// Written inside epoch `epoch + 1` (`--checkpoint-every`): how far that epoch got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial: Option<PartialEpoch>,
}

/// How far an unfinished epoch got: a run resumed from it skips the epoch's first `steps`
/// batches (the sample order and augmentation are pure functions of the seed, epoch and
/// sample) and adds these tallies to the rest of the epoch's.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq)]
pub struct PartialEpoch {
    /// Optimisation steps of the epoch done.
    pub steps: usize,
    /// `[loss × samples, correct, samples]` over every rank's steps so far.
    pub sums: [f64; 3],
    /// Seconds spent training the epoch so far.
    pub seconds: f64,
}

/// A checkpoint in memory.
#[derive(Debug, Clone)]
pub struct Checkpoint {
    /// Metadata.
    pub meta: CheckpointMeta,
    /// Model record (burn's binary format, full precision).
    pub model: Vec<u8>,
    /// Optimizer record, empty when not saved.
    pub optimizer: Vec<u8>,
}

fn put_section(out: &mut Vec<u8>, bytes: &[u8]) {
    out.extend_from_slice(&(bytes.len() as u64).to_le_bytes());
    out.extend_from_slice(bytes);
}

impl Checkpoint {
    /// Serialises to bytes: magic, CRC-32 of the rest, then three length-prefixed sections.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut body = Vec::with_capacity(self.model.len() + self.optimizer.len() + 4096);
        put_section(&mut body, &serde_json::to_vec(&self.meta).expect("meta serialises"));
        put_section(&mut body, &self.model);
        put_section(&mut body, &self.optimizer);
        let mut out = Vec::with_capacity(body.len() + 12);
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&crc32fast::hash(&body).to_le_bytes());
        out.extend_from_slice(&body);
        out
    }

    /// Parses bytes written by [`Checkpoint::to_bytes`].
    ///
    /// # Errors
    /// [`Error::BadCheckpoint`] for a wrong magic, a checksum mismatch (truncated or corrupt
    /// file) or malformed sections.
    pub fn from_bytes(bytes: &[u8], path: &Path) -> Result<Self> {
        let bad = |reason: &str| Error::BadCheckpoint { path: path.to_path_buf(), reason: reason.to_string() };
        if bytes.len() < 12 || &bytes[..8] != MAGIC {
            return Err(bad("not a burn-vision checkpoint (wrong magic); pass a .ckpt file written by `train`"));
        }
        let crc = u32::from_le_bytes(bytes[8..12].try_into().unwrap());
        let body = &bytes[12..];
        if crc32fast::hash(body) != crc {
            return Err(bad(
                "checksum mismatch: the file is truncated or corrupt; use the other checkpoint (best/last) or retrain",
            ));
        }
        let mut rest = body;
        let mut section = || -> Result<Vec<u8>> {
            if rest.len() < 8 {
                return Err(bad("truncated section header"));
            }
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            if rest.len() - 8 < len {
                return Err(bad("truncated section"));
            }
            let out = rest[8..8 + len].to_vec();
            rest = &rest[8 + len..];
            Ok(out)
        };
        let meta = serde_json::from_slice(&section()?).map_err(|e| bad(&format!("metadata: {e}")))?;
        Ok(Self { meta, model: section()?, optimizer: section()? })
    }

    /// Writes the checkpoint atomically.
    ///
    /// # Errors
    /// When writing fails.
    pub fn save(&self, path: &Path) -> Result<()> {
        crate::atomic_file::write_atomic(path, &self.to_bytes())
    }

    /// Reads and validates a checkpoint.
    ///
    /// # Errors
    /// When it cannot be read or is not valid.
    pub fn load(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::BadCheckpoint { path: path.to_path_buf(), reason: "file not found".into() }
            }
            _ => Error::io("reading", path, e),
        })?;
        Self::from_bytes(&bytes, path)
    }
}

/// The run folder's checkpoint of the last finished epoch.
pub fn last_path(out: &Path) -> PathBuf {
    out.join("last.ckpt")
}

/// The run folder's checkpoint with the best validation accuracy.
pub fn best_path(out: &Path) -> PathBuf {
    out.join("best.ckpt")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                model: "resnet18".into(),
                classes: vec!["a".into(), "b".into()],
                in_channels: 3,
                small_input: false,
                image_size: 224,
                epoch: 3,
                step: 300,
                best_acc: 0.5,
                val_acc: 0.4,
                config: serde_json::json!({ "lr": 0.1 }),
                batches_tracked: Some(5),
                partial: Some(PartialEpoch { steps: 7, sums: [1.5, 3.0, 4.0], seconds: 2.5 }),
            },
            model: (0..1000u32).map(|i| i as u8).collect(),
            optimizer: vec![7; 33],
        }
    }

    #[test]
    fn round_trips_and_detects_damage() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("x.ckpt");
        let ck = sample();
        ck.save(&path).unwrap();
        let back = Checkpoint::load(&path).unwrap();
        assert_eq!(back.meta, ck.meta);
        assert_eq!(back.model, ck.model);
        assert_eq!(back.optimizer, ck.optimizer);

        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 10]).unwrap();
        let err = Checkpoint::load(&path).unwrap_err().to_string();
        assert!(err.contains("truncated or corrupt"), "{err}");

        let mut flipped = bytes.clone();
        flipped[500] ^= 1;
        std::fs::write(&path, &flipped).unwrap();
        assert!(Checkpoint::load(&path).is_err());

        std::fs::write(&path, b"hello").unwrap();
        assert!(Checkpoint::load(&path).unwrap_err().to_string().contains("wrong magic"));
        assert!(Checkpoint::load(&dir.path().join("none")).unwrap_err().to_string().contains("not found"));
    }
}
