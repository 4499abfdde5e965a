//! What rank 0 writes: the validation samples' list at the start, then after each epoch the log
//! line, `last.ckpt` (and `best.ckpt` when it improved), a `metrics.jsonl` line and the
//! TensorBoard scalars.

use super::checkpoint::{Checkpoint, CheckpointMeta, PartialEpoch, best_path, last_path};
use super::config::TrainConfig;
use super::metrics::{EpochRecord, MetricsLog};
use crate::atomic_file::write_atomic;
use crate::data::Dataset;
use crate::error::{Error, Result};
use crate::model::classifier::Classifier;
use crate::train::instrument::tensorboard::EventWriter;
use burn::module::Module;
use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn::tensor::backend::AutodiffBackend;
use burn_optim::Optimizer;

type Bytes = BinBytesRecorder<FullPrecisionSettings>;

/// The run folder's list of the validation samples.
pub const VALIDATION_LIST: &str = "validation.txt";

/// Rank 0's run folder: metrics log and TensorBoard writer (its folder made with the first
/// epoch's scalars, so a run that fails before leaves no empty `tensorboard/` behind).
pub(super) struct RunOutputs {
    metrics: MetricsLog,
    board: Option<EventWriter>,
    board_dir: std::path::PathBuf,
}

/// What a checkpoint records besides the model and the optimizer.
pub(super) struct CheckpointFacts {
    pub classes: Vec<String>,
    pub in_channels: usize,
    pub image_size: u32,
    /// BatchNorm forward passes before this run's first step (the pretrained file's).
    pub batches_tracked_before: i64,
}

impl RunOutputs {
    /// Creates `config.out` and drops metrics lines past `start_epoch` (a resumed run rewrites
    /// what came after its checkpoint).
    ///
    /// # Errors
    /// When the folder or its files cannot be written.
    pub fn open(config: &TrainConfig, start_epoch: usize) -> Result<Self> {
        let out = &config.out;
        std::fs::create_dir_all(out).map_err(|e| Error::io("creating", out, e))?;
        let metrics = MetricsLog::new(&out.join("metrics.jsonl"));
        metrics.truncate_to(start_epoch)?;
        Ok(Self { metrics, board: None, board_dir: out.join("tensorboard") })
    }

    /// Writes `validation.txt`: the samples held out for validation, one per line as the data
    /// names them (a file's path, `shard.tar:member`, `file.gz#index`), so the very same
    /// validation set can be scored elsewhere — another framework's evaluation included.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write_validation_list(&self, config: &TrainConfig, dataset: &dyn Dataset, val_idx: &[usize]) -> Result<()> {
        let lines: String = val_idx.iter().map(|&i| dataset.describe(i) + "\n").collect();
        write_atomic(&config.out.join(VALIDATION_LIST), lines.as_bytes())
    }

    /// Logs `record`, saves the checkpoints (best when `improved`), then appends the metrics
    /// line and the TensorBoard scalars (step = epoch).
    ///
    /// # Errors
    /// When a file cannot be written.
    pub fn epoch_done<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
        &mut self,
        config: &TrainConfig,
        record: &EpochRecord,
        (model, optim, step): (&Classifier<B>, &O, usize),
        facts: &CheckpointFacts,
        (best_acc, improved): (f64, bool),
    ) -> Result<()> {
        let gpu = record.gpu_memory_gib.map_or(String::new(), |g| format!(" | GPU memory {g:.2} GiB"));
        // Where the GPU decodes the JPEGs, how long nvJPEG kept the loader a batch: what sets the
        // data's pace when the loop waits for it.
        let decode =
            record.device_decode.as_ref().map_or(String::new(), |d| format!(", nvJPEG {:.1} ms a batch", d.submit_ms));
        log::info!(
            "epoch {}/{}: train loss {:.4} acc {:.2}% | val loss {:.4} acc {:.2}% top-5 {:.2}% | lr {:.2e} | {:.0} img/s ({:.0} after warm-up, {:.1}s waiting for data{decode}){gpu} | {:.1}s",
            record.epoch,
            config.epochs,
            record.train_loss,
            100.0 * record.train_acc,
            record.val_loss,
            100.0 * record.val_acc,
            100.0 * record.val_acc5,
            record.lr,
            record.img_per_s,
            record.steady_img_per_s.unwrap_or(record.img_per_s),
            record.data_wait_s,
            record.seconds
        );
        let ck = checkpoint(config, (model, optim, step), facts, (record.epoch, best_acc, record.val_acc), None)?;
        if improved {
            Checkpoint { optimizer: Vec::new(), ..ck.clone() }.save(&best_path(&config.out))?;
        }
        ck.save(&last_path(&config.out))?;
        self.metrics.append(record)?;
        let scalars = [
            ("train/loss", record.train_loss),
            ("train/acc", record.train_acc),
            ("val/loss", record.val_loss),
            ("val/acc", record.val_acc),
            ("val/acc5", record.val_acc5),
            ("lr", record.lr),
            ("img_per_s", record.img_per_s),
        ];
        let board = match &mut self.board {
            Some(board) => board,
            empty => empty.insert(EventWriter::create(&self.board_dir)?),
        };
        for (tag, value) in scalars {
            board.scalar(tag, value, record.epoch as i64)?;
        }
        board.flush()
    }

    /// Saves `last.ckpt` inside an epoch (`--checkpoint-every`): `epoch` epochs finished,
    /// `partial` of the next one done.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn step_saved<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
        &self,
        config: &TrainConfig,
        state: (&Classifier<B>, &O, usize),
        facts: &CheckpointFacts,
        (epoch, best_acc, val_acc): (usize, f64, f64),
        partial: PartialEpoch,
    ) -> Result<()> {
        checkpoint(config, state, facts, (epoch, best_acc, val_acc), Some(partial))?.save(&last_path(&config.out))?;
        log::debug!(
            "saved {} at step {} ({} steps into epoch {})",
            last_path(&config.out).display(),
            state.2,
            partial.steps,
            epoch + 1
        );
        Ok(())
    }
}

/// The checkpoint of the run's state after `step` steps: `epoch` epochs finished (and
/// `partial` of the next one), the best and the last validation top-1.
fn checkpoint<B: AutodiffBackend, O: Optimizer<Classifier<B>, B>>(
    config: &TrainConfig,
    (model, optim, step): (&Classifier<B>, &O, usize),
    facts: &CheckpointFacts,
    (epoch, best_acc, val_acc): (usize, f64, f64),
    partial: Option<PartialEpoch>,
) -> Result<Checkpoint> {
    let bad =
        |e: burn::record::RecorderError| Error::BadCheckpoint { path: last_path(&config.out), reason: e.to_string() };
    Ok(Checkpoint {
        meta: CheckpointMeta {
            model: config.model.clone(),
            classes: facts.classes.clone(),
            in_channels: facts.in_channels,
            small_input: config.small_input,
            image_size: facts.image_size,
            epoch,
            step,
            best_acc,
            val_acc,
            config: serde_json::to_value(config).expect("config serialises"),
            batches_tracked: Some(facts.batches_tracked_before + step as i64),
            partial,
        },
        model: Bytes::default().record(model.clone().into_record(), ()).map_err(bad)?,
        optimizer: Bytes::default().record(optim.to_record(), ()).map_err(bad)?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tensorboard_folder_comes_with_the_first_scalars() {
        let dir = tempfile::tempdir().unwrap();
        let config = TrainConfig { out: dir.path().join("run"), ..TrainConfig::default() };
        let outputs = RunOutputs::open(&config, 0).unwrap();
        drop(outputs); // a run that fails before its first epoch ends
        assert!(config.out.join("metrics.jsonl").parent().unwrap().exists());
        assert!(!config.out.join("tensorboard").exists(), "an empty tensorboard/ folder was left behind");
    }
}
