//! `torch.save`'s file format for a state dict, written (burn-store reads it but cannot write
//! it): a zip archive holding `archive/data.pkl` — a protocol-2 pickle of an `OrderedDict` whose
//! values are `torch._utils._rebuild_tensor_v2(storage, offset, size, stride, requires_grad,
//! hooks)` calls, each storage a persistent id `('storage', torch.FloatStorage, key, 'cpu',
//! numel)` — the storages' bytes as `archive/data/KEY` (64-byte aligned, uncompressed, as
//! PyTorch writes them), `archive/byteorder` and `archive/version`. Only the globals that
//! `torch.load(weights_only=True)` allows are used.

use std::io::Write;

/// A tensor's element type in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Storage {
    /// `torch.float32`.
    Float,
    /// `torch.int64`.
    Long,
}

/// One entry of the state dict: contiguous little-endian bytes.
pub struct Entry {
    /// Key (`layer1.0.conv1.weight`).
    pub name: String,
    /// Element type.
    pub storage: Storage,
    /// Shape (`[]` for a scalar).
    pub shape: Vec<usize>,
    /// The elements' bytes, little-endian, row-major.
    pub bytes: Vec<u8>,
}

/// A pickle program under construction (protocol 2 opcodes).
#[derive(Default)]
struct Pickle(Vec<u8>);

impl Pickle {
    fn op(&mut self, code: u8) {
        self.0.push(code);
    }
    fn global(&mut self, module: &str, name: &str) {
        self.0.push(b'c');
        self.0.extend_from_slice(format!("{module}\n{name}\n").as_bytes());
    }
    fn string(&mut self, s: &str) {
        self.0.push(b'X'); // BINUNICODE
        self.0.extend_from_slice(&(s.len() as u32).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
    }
    fn int(&mut self, v: usize) {
        match i32::try_from(v) {
            Ok(v) => {
                self.0.push(b'J'); // BININT
                self.0.extend_from_slice(&v.to_le_bytes());
            }
            Err(_) => {
                self.0.extend_from_slice(&[0x8a, 8]); // LONG1, 8 bytes
                self.0.extend_from_slice(&(v as i64).to_le_bytes());
            }
        }
    }
    fn tuple(&mut self, items: &[usize]) {
        self.op(b'(');
        for &i in items {
            self.int(i);
        }
        self.op(b't');
    }
    fn empty_ordered_dict(&mut self) {
        self.global("collections", "OrderedDict");
        self.op(b')'); // EMPTY_TUPLE
        self.op(b'R'); // REDUCE
    }
    /// `_rebuild_tensor_v2(storage KEY, 0, shape, contiguous strides, False, OrderedDict())`.
    fn tensor(&mut self, key: &str, e: &Entry) {
        self.global("torch._utils", "_rebuild_tensor_v2");
        self.op(b'(');
        self.op(b'(');
        self.string("storage");
        self.global("torch", if e.storage == Storage::Float { "FloatStorage" } else { "LongStorage" });
        self.string(key);
        self.string("cpu");
        self.int(e.shape.iter().product());
        self.op(b't');
        self.op(b'Q'); // BINPERSID
        self.int(0);
        self.tuple(&e.shape);
        let mut strides = vec![1usize; e.shape.len()];
        for i in (0..e.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * e.shape[i + 1];
        }
        self.tuple(&strides);
        self.op(0x89); // NEWFALSE: requires_grad
        self.empty_ordered_dict(); // backward hooks
        self.op(b't');
        self.op(b'R');
    }
}

fn data_pkl(entries: &[Entry]) -> Vec<u8> {
    let mut p = Pickle::default();
    p.0.extend_from_slice(&[0x80, 2]); // PROTO 2
    p.empty_ordered_dict();
    p.op(b'(');
    for (i, e) in entries.iter().enumerate() {
        p.string(&e.name);
        p.tensor(&i.to_string(), e);
    }
    p.op(b'u'); // SETITEMS
    p.op(b'.'); // STOP
    p.0
}

/// The bytes of a `.pth` file holding `entries` as a state dict.
///
/// # Errors
/// The zip writer's, which only fails on I/O (none here: it writes to memory).
pub fn to_bytes(entries: &[Entry]) -> zip::result::ZipResult<Vec<u8>> {
    let mut zip = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    zip.start_file("archive/data.pkl", stored)?;
    zip.write_all(&data_pkl(entries))?;
    zip.start_file("archive/byteorder", stored)?;
    zip.write_all(b"little")?;
    for (i, e) in entries.iter().enumerate() {
        let big = e.bytes.len() as u64 >= u64::from(u32::MAX);
        zip.start_file(format!("archive/data/{i}"), stored.with_alignment(64).large_file(big))?;
        zip.write_all(&e.bytes)?;
    }
    zip.start_file("archive/version", stored)?;
    zip.write_all(b"3\n")?;
    Ok(zip.finish()?.into_inner())
}
