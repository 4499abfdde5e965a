//! TensorBoard scalars, written by rank 0 beside `metrics.jsonl` (the seed tutorial's rank-0
//! TensorBoard logs): `tensorboard --logdir RUN_DIR/tensorboard`.
//!
//! The file is TensorFlow's record format — per record: length (u64 LE), masked CRC-32C of the
//! length, the bytes, masked CRC-32C of the bytes — holding `Event` protocol buffers. Only the
//! fields a scalar needs are encoded (wall_time, step, file_version, summary.value{tag,
//! simple_value}). The maintained crates for this pull in a whole protobuf stack or are
//! unmaintained; the encoding is small and checked byte for byte against TensorBoard's own writer
//! (see the test's golden bytes).

use crate::error::{Error, Result};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Appends scalar events to one new event file in a directory.
pub struct EventWriter {
    file: BufWriter<File>,
    path: PathBuf,
}

fn masked_crc(bytes: &[u8]) -> u32 {
    let crc = crc32c::crc32c(bytes);
    crc.rotate_right(15).wrapping_add(0xa282_ead8)
}

fn varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

fn bytes_field(out: &mut Vec<u8>, field: u64, bytes: &[u8]) {
    varint(out, field << 3 | 2);
    varint(out, bytes.len() as u64);
    out.extend_from_slice(bytes);
}

/// One `Event` message: `wall_time` (field 1, double), `step` (2, int64), then either
/// `file_version` (3) or `summary` (5) with one `Value { tag (1), simple_value (2, float) }`.
fn event(wall_time: f64, step: i64, body: EventBody<'_>) -> Vec<u8> {
    let mut e = Vec::with_capacity(64);
    varint(&mut e, 1 << 3 | 1);
    e.extend_from_slice(&wall_time.to_le_bytes());
    if step != 0 {
        varint(&mut e, 2 << 3);
        varint(&mut e, step as u64);
    }
    match body {
        EventBody::FileVersion(v) => bytes_field(&mut e, 3, v.as_bytes()),
        EventBody::Scalar { tag, value } => {
            let mut v = Vec::with_capacity(tag.len() + 8);
            bytes_field(&mut v, 1, tag.as_bytes());
            varint(&mut v, 2 << 3 | 5);
            v.extend_from_slice(&value.to_le_bytes());
            let mut summary = Vec::with_capacity(v.len() + 2);
            bytes_field(&mut summary, 1, &v);
            bytes_field(&mut e, 5, &summary);
        }
    }
    e
}

enum EventBody<'a> {
    FileVersion(&'a str),
    Scalar { tag: &'a str, value: f32 },
}

/// One framed record of TensorFlow's record format.
fn record(data: &[u8]) -> Vec<u8> {
    let len = (data.len() as u64).to_le_bytes();
    let mut r = Vec::with_capacity(data.len() + 16);
    r.extend_from_slice(&len);
    r.extend_from_slice(&masked_crc(&len).to_le_bytes());
    r.extend_from_slice(data);
    r.extend_from_slice(&masked_crc(data).to_le_bytes());
    r
}

fn now() -> f64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64())
}

impl EventWriter {
    /// Creates `dir` and a new event file in it (`events.out.tfevents.<seconds>.<host>`; a
    /// resumed run adds a file, which TensorBoard reads as the continuation).
    ///
    /// # Errors
    /// [`Error::Io`] when the folder or file cannot be created or written.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| Error::io("creating", dir, e))?;
        let host = std::fs::read_to_string("/etc/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "localhost".into());
        let wall = now();
        let mut name = format!("events.out.tfevents.{}.{host}", wall as u64);
        let mut n = 0;
        while dir.join(&name).exists() {
            n += 1;
            name = format!("events.out.tfevents.{}.{host}.{n}", wall as u64);
        }
        let path = dir.join(name);
        let file = File::create(&path).map_err(|e| Error::io("creating", &path, e))?;
        let mut w = Self { file: BufWriter::new(file), path };
        w.write(&event(wall, 0, EventBody::FileVersion("brain.Event:2")))?;
        w.flush()?;
        Ok(w)
    }

    /// The event file.
    pub fn path(&self) -> &Path {
        &self.path
    }

    fn write(&mut self, event: &[u8]) -> Result<()> {
        let path = &self.path;
        self.file.write_all(&record(event)).map_err(|e| Error::io("writing", path, e))
    }

    /// Adds one scalar (e.g. `val/acc`) at `step`.
    ///
    /// # Errors
    /// [`Error::Io`] on a write failure.
    pub fn scalar(&mut self, tag: &str, value: f64, step: i64) -> Result<()> {
        self.write(&event(now(), step, EventBody::Scalar { tag, value: value as f32 }))
    }

    /// Writes buffered events through to the file and syncs it, so a crash loses nothing
    /// already flushed.
    ///
    /// # Errors
    /// [`Error::Io`] on a write failure.
    pub fn flush(&mut self) -> Result<()> {
        let path = &self.path;
        self.file.flush().map_err(|e| Error::io("writing", path, e))?;
        self.file.get_ref().sync_data().map_err(|e| Error::io("syncing", path, e))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Made by TensorBoard 2.21's own writer (protobuf 7.36), with
    /// `burn-vision/tests/golden/make_tfevents.py`: the file-version event at wall time
    /// 1764547200.25, then `val/acc` = 0.8125 at step 3 and `train/loss` = 0.4375 at step 12,
    /// both at wall time 1764547260.5.
    const GOLDEN: &str = include_str!("../../../tests/golden/tfevents.hex");

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn records_match_tensorboards_own_writer_byte_for_byte() {
        let mut ours = record(&event(1764547200.25, 0, EventBody::FileVersion("brain.Event:2")));
        ours.extend(record(&event(1764547260.5, 3, EventBody::Scalar { tag: "val/acc", value: 0.8125 })));
        ours.extend(record(&event(1764547260.5, 12, EventBody::Scalar { tag: "train/loss", value: 0.4375 })));
        assert_eq!(hex(&ours), GOLDEN.trim());
    }

    #[test]
    fn writer_appends_framed_records_to_a_new_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut w = EventWriter::create(dir.path()).unwrap();
        w.scalar("val/acc", 0.5, 1).unwrap();
        w.flush().unwrap();
        let second = EventWriter::create(dir.path()).unwrap();
        assert_ne!(second.path(), w.path(), "a resumed run gets its own file");
        let bytes = std::fs::read(w.path()).unwrap();
        // Walk the records: every length and checksum must hold.
        let (mut at, mut records) = (0, 0);
        while at < bytes.len() {
            let len = u64::from_le_bytes(bytes[at..at + 8].try_into().unwrap()) as usize;
            assert_eq!(u32::from_le_bytes(bytes[at + 8..at + 12].try_into().unwrap()), masked_crc(&bytes[at..at + 8]));
            let data = &bytes[at + 12..at + 12 + len];
            assert_eq!(u32::from_le_bytes(bytes[at + 12 + len..at + 16 + len].try_into().unwrap()), masked_crc(data));
            at += 16 + len;
            records += 1;
        }
        assert_eq!(records, 2);
        assert!(bytes.windows(7).any(|w| w == b"val/acc"));
    }
}
