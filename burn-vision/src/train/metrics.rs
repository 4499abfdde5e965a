//! Accuracy counting and the JSONL metrics log (one line per epoch, flushed as written).

use crate::error::{Error, Result};
use serde::Serialize;
use std::io::Write;
use std::path::{Path, PathBuf};

/// Running sums over a pass of the data.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Tally {
    /// Sum of per-sample losses.
    pub loss_sum: f64,
    /// Samples whose top-1 prediction is right.
    pub top1: usize,
    /// Samples whose label is among the top-5 predictions.
    pub top5: usize,
    /// Samples seen.
    pub count: usize,
}

impl Tally {
    /// Adds one batch: `logits` row-major `[n, classes]`, `labels` `[n]`, `mean_loss` the batch mean.
    ///
    /// # Panics
    /// If the logits length is not `labels.len() · classes`.
    pub fn add(&mut self, logits: &[f32], labels: &[i64], classes: usize, mean_loss: f64) {
        assert_eq!(
            logits.len(),
            labels.len() * classes,
            "Got {} logits for {} labels × {classes} classes",
            logits.len(),
            labels.len()
        );
        for (row, &label) in logits.chunks(classes).zip(labels) {
            let target = row[label as usize];
            // Rank of the true class: how many classes score strictly higher (ties favour the label).
            let higher = row.iter().filter(|&&v| v > target).count();
            self.top1 += usize::from(higher == 0);
            self.top5 += usize::from(higher < 5);
        }
        self.loss_sum += mean_loss * labels.len() as f64;
        self.count += labels.len();
    }

    /// Merges another tally.
    pub fn merge(&mut self, other: Tally) {
        self.loss_sum += other.loss_sum;
        self.top1 += other.top1;
        self.top5 += other.top5;
        self.count += other.count;
    }

    /// Mean loss (0 with no samples).
    pub fn loss(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.loss_sum / self.count as f64 }
    }
    /// Top-1 accuracy in [0, 1].
    pub fn acc1(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.top1 as f64 / self.count as f64 }
    }
    /// Top-5 accuracy in [0, 1].
    pub fn acc5(&self) -> f64 {
        if self.count == 0 { 0.0 } else { self.top5 as f64 / self.count as f64 }
    }
}

/// One epoch's line in `metrics.jsonl`.
#[derive(Debug, Clone, Serialize, serde::Deserialize, PartialEq)]
pub struct EpochRecord {
    /// Epoch number, from 1.
    pub epoch: usize,
    /// Mean training loss.
    pub train_loss: f64,
    /// Training top-1 accuracy.
    pub train_acc: f64,
    /// Mean validation loss.
    pub val_loss: f64,
    /// Validation top-1 accuracy.
    pub val_acc: f64,
    /// Validation top-5 accuracy.
    pub val_acc5: f64,
    /// Learning rate at the end of the epoch.
    pub lr: f64,
    /// Training images per second (all ranks together).
    pub img_per_s: f64,
    /// The same after the epoch's first two steps (one in epochs of under four steps), which
    /// carry one-time costs (kernel tuning and compilation, cuDNN's algorithm search, the
    /// optimizer's first step with state); absent when no step is left after them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steady_img_per_s: Option<f64>,
    /// Seconds the training loop waited for the data loader this epoch (this rank): near zero
    /// when the device, not the input pipeline, limits training.
    #[serde(default)]
    pub data_wait_s: f64,
    /// Host seconds per step phase this epoch (`data`, `upload`, `forward`, `backward`,
    /// `grad_sync`, `optimizer`; see `train::phases`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub phases_s: Vec<(String, f64)>,
    /// Where the data loader's thread spent each training batch it handed to the GPU's JPEG
    /// decoder this epoch, in milliseconds a batch (as `bench-data`'s `device_submit`: waiting
    /// for a free decode slot, for the slot's previous decode and reads, in nvJPEG's calls);
    /// absent when this process decoded nothing on a GPU in the epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device_decode: Option<crate::data::throughput::DeviceSubmit>,
    /// Wall-clock seconds of the epoch, validation included.
    pub seconds: f64,
    /// Images skipped as unreadable so far.
    pub skipped_images: usize,
    /// GPU memory this rank's process held at the end of the epoch's training steps, in GiB
    /// (what nvidia-smi shows for it; the device's whole use where NVML cannot tell): the
    /// training step's peak, as the allocator keeps what the step needed. Absent on CPUs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu_memory_gib: Option<f64>,
}

/// Appends JSON lines to a file, flushing each.
#[derive(Debug)]
pub struct MetricsLog {
    path: PathBuf,
}

impl MetricsLog {
    /// A log at `path` (created on first write).
    pub fn new(path: &Path) -> Self {
        Self { path: path.to_path_buf() }
    }

    /// Appends one record as a line.
    ///
    /// # Errors
    /// When the file cannot be opened or written.
    pub fn append<T: Serialize>(&self, record: &T) -> Result<()> {
        let mut file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.path)
            .map_err(|e| Error::io("opening", &self.path, e))?;
        let line = serde_json::to_string(record).expect("metrics serialise");
        writeln!(file, "{line}").and_then(|_| file.sync_data()).map_err(|e| Error::io("writing", &self.path, e))
    }

    /// Keeps only the first `epochs` lines (used on resume, so a crashed epoch's line is not
    /// duplicated).
    ///
    /// # Errors
    /// When the file cannot be read or rewritten.
    pub fn truncate_to(&self, epochs: usize) -> Result<()> {
        let Ok(text) = std::fs::read_to_string(&self.path) else { return Ok(()) };
        let kept: String = text.lines().take(epochs).map(|l| format!("{l}\n")).collect();
        crate::atomic_file::write_atomic(&self.path, kept.as_bytes())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn top1_and_top5_count_ranks() {
        let mut t = Tally::default();
        // 6 classes; label 0 ranked 1st, label 5 ranked 6th, label 2 ranked 5th.
        let logits = [
            9.0, 1.0, 2.0, 3.0, 4.0, 5.0, //
            9.0, 8.0, 7.0, 6.0, 5.0, 0.0, //
            9.0, 8.0, 1.0, 6.0, 5.0, 0.0,
        ];
        t.add(&logits, &[0, 5, 2], 6, 2.0);
        assert_eq!((t.top1, t.top5, t.count), (1, 2, 3));
        assert!((t.loss() - 2.0).abs() < 1e-12);
        assert!((t.acc5() - 2.0 / 3.0).abs() < 1e-12);
    }

    #[test]
    fn log_appends_lines_and_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let log = MetricsLog::new(&dir.path().join("m.jsonl"));
        for i in 0..3 {
            log.append(&serde_json::json!({ "epoch": i })).unwrap();
        }
        log.truncate_to(2).unwrap();
        let text = std::fs::read_to_string(dir.path().join("m.jsonl")).unwrap();
        assert_eq!(text, "{\"epoch\":0}\n{\"epoch\":1}\n");
    }

    /// A line written before `device_decode` existed still reads (as none), and a record with
    /// the loader's hand-over times writes them under their names and reads them back.
    #[test]
    fn epoch_records_carry_the_decoders_hand_over_when_there_was_one() {
        let old = r#"{"epoch":1,"train_loss":1.5,"train_acc":0.4,"val_loss":1.2,"val_acc":0.5,"val_acc5":0.9,"lr":0.1,"img_per_s":100.0,"data_wait_s":0.0,"seconds":2.0,"skipped_images":0}"#;
        let mut record: EpochRecord = serde_json::from_str(old).unwrap();
        assert_eq!(record.device_decode, None);
        assert!(!serde_json::to_string(&record).unwrap().contains("device_decode"));
        record.device_decode = Some(crate::data::throughput::DeviceSubmit {
            batches: 30,
            slot_wait_ms: 0.25,
            reuse_wait_ms: 0.03,
            submit_ms: 11.5,
        });
        let line = serde_json::to_string(&record).unwrap();
        assert!(
            line.contains(
                r#""device_decode":{"batches":30,"slot_wait_ms":0.25,"reuse_wait_ms":0.03,"submit_ms":11.5}"#
            ),
            "{line}"
        );
        assert_eq!(serde_json::from_str::<EpochRecord>(&line).unwrap(), record);
    }
}
