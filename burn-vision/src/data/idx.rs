//! The IDX format of MNIST and Fashion-MNIST (`.idx` or gzip-compressed `.gz`), held in memory.

use super::Dataset;
use crate::error::{Error, Result};
use flate2::read::GzDecoder;
use image::{DynamicImage, GrayImage};
use std::io::Read;
use std::path::{Path, PathBuf};

/// Fashion-MNIST's ten class names, by label.
pub const FASHION_MNIST_CLASSES: [&str; 10] =
    ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"];

/// Grayscale images and their labels from a pair of IDX files.
#[derive(Debug, Clone)]
pub struct IdxDataset {
    pixels: Vec<u8>,
    labels: Vec<u8>,
    rows: usize,
    cols: usize,
    classes: Vec<String>,
    name: String,
}

/// One parsed IDX array: its dimensions and raw unsigned-byte payload.
#[derive(Debug)]
pub struct IdxArray {
    /// Sizes of each dimension.
    pub dims: Vec<usize>,
    /// Row-major bytes.
    pub data: Vec<u8>,
}

/// Parses an IDX array of unsigned bytes (type 0x08) from `bytes`, gunzipping first when the
/// bytes start with the gzip magic.
///
/// # Errors
/// [`Error::BadIdx`] for a wrong magic, an unsupported element type, or a payload shorter or
/// longer than the header says.
pub fn parse_idx(bytes: &[u8], path: &Path) -> Result<IdxArray> {
    let bad = |reason: String| Error::BadIdx { path: path.to_path_buf(), reason };
    let raw;
    let bytes = if bytes.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        GzDecoder::new(bytes).read_to_end(&mut out).map_err(|e| bad(format!("gzip: {e}")))?;
        raw = out;
        &raw[..]
    } else {
        bytes
    };
    if bytes.len() < 4 || bytes[0] != 0 || bytes[1] != 0 {
        return Err(bad("missing the 00 00 magic".into()));
    }
    if bytes[2] != 0x08 {
        return Err(bad(format!("element type 0x{:02x} unsupported (only unsigned bytes, 0x08)", bytes[2])));
    }
    let ndim = bytes[3] as usize;
    let header = 4 + 4 * ndim;
    if ndim == 0 || bytes.len() < header {
        return Err(bad(format!("header of {ndim} dimensions is truncated")));
    }
    let dims: Vec<usize> =
        (0..ndim).map(|d| u32::from_be_bytes(bytes[4 + 4 * d..8 + 4 * d].try_into().unwrap()) as usize).collect();
    let expected = dims.iter().try_fold(1usize, |acc, &d| acc.checked_mul(d));
    let payload = bytes.len() - header;
    if expected != Some(payload) {
        return Err(bad(format!("dimensions {dims:?} need {expected:?} bytes, file has {payload}")));
    }
    Ok(IdxArray { dims, data: bytes[header..].to_vec() })
}

fn read_file(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|e| Error::io("reading", path, e))
}

impl IdxDataset {
    /// Builds a dataset from already-read image and label IDX bytes.
    ///
    /// # Errors
    /// When either array is malformed, images are not 3-D, or the counts differ.
    pub fn from_bytes(images: &[u8], labels: &[u8], name: &str, classes: Vec<String>) -> Result<Self> {
        let path = PathBuf::from(name);
        let images = parse_idx(images, &path)?;
        let labels = parse_idx(labels, &path)?;
        let bad = |reason: String| Error::BadIdx { path: path.clone(), reason };
        if images.dims.len() != 3 || labels.dims.len() != 1 {
            return Err(bad(format!(
                "expected images [N,H,W] and labels [N], got {:?} and {:?}",
                images.dims, labels.dims
            )));
        }
        if images.dims[0] != labels.dims[0] {
            return Err(bad(format!("{} images but {} labels", images.dims[0], labels.dims[0])));
        }
        let max_label = labels.data.iter().copied().max().unwrap_or(0) as usize;
        let mut classes = classes;
        for extra in classes.len()..=max_label {
            classes.push(format!("class_{extra}"));
        }
        Ok(Self {
            rows: images.dims[1],
            cols: images.dims[2],
            pixels: images.data,
            labels: labels.data,
            classes,
            name: name.to_string(),
        })
    }

    /// Reads `images` and `labels` IDX files (plain or `.gz`).
    ///
    /// # Errors
    /// When a file cannot be read or is malformed.
    pub fn open(images: &Path, labels: &Path, classes: Vec<String>) -> Result<Self> {
        Self::from_bytes(&read_file(images)?, &read_file(labels)?, &images.display().to_string(), classes)
    }

    /// Image height and width.
    pub fn image_size(&self) -> (usize, usize) {
        (self.rows, self.cols)
    }

    /// Keeps the first `per_class` samples of every class, in file order.
    pub fn take_per_class(&self, per_class: usize) -> Self {
        let mut counts = vec![0usize; self.classes.len()];
        let size = self.rows * self.cols;
        let mut pixels = Vec::new();
        let mut labels = Vec::new();
        for (i, &l) in self.labels.iter().enumerate() {
            if counts[l as usize] < per_class {
                counts[l as usize] += 1;
                labels.push(l);
                pixels.extend_from_slice(&self.pixels[i * size..(i + 1) * size]);
            }
        }
        Self {
            pixels,
            labels,
            rows: self.rows,
            cols: self.cols,
            classes: self.classes.clone(),
            name: self.name.clone(),
        }
    }

    /// The raw pixels of sample `index` (row-major, one byte per pixel).
    pub fn pixels(&self, index: usize) -> &[u8] {
        let size = self.rows * self.cols;
        &self.pixels[index * size..(index + 1) * size]
    }
}

impl Dataset for IdxDataset {
    fn len(&self) -> usize {
        self.labels.len()
    }
    fn label(&self, index: usize) -> usize {
        self.labels[index] as usize
    }
    fn load(&self, index: usize) -> Result<DynamicImage> {
        let img = GrayImage::from_raw(self.cols as u32, self.rows as u32, self.pixels(index).to_vec())
            .expect("IDX payload size was checked at load");
        Ok(DynamicImage::ImageLuma8(img))
    }
    fn describe(&self, index: usize) -> String {
        format!("{}#{index}", self.name)
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn idx(dims: &[u32], data: &[u8]) -> Vec<u8> {
        let mut out = vec![0, 0, 8, dims.len() as u8];
        for d in dims {
            out.extend_from_slice(&d.to_be_bytes());
        }
        out.extend_from_slice(data);
        out
    }

    #[test]
    fn parses_plain_and_gz() {
        let images = idx(&[2, 2, 3], &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
        let labels = idx(&[2], &[3, 1]);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        std::io::Write::write_all(&mut gz, &images).unwrap();
        let images_gz = gz.finish().unwrap();
        for imgs in [&images, &images_gz] {
            let ds = IdxDataset::from_bytes(imgs, &labels, "t", vec![]).unwrap();
            assert_eq!(ds.len(), 2);
            assert_eq!(ds.image_size(), (2, 3));
            assert_eq!(ds.label(0), 3);
            assert_eq!(ds.classes().len(), 4);
            let im = ds.load(1).unwrap().to_luma8();
            assert_eq!(im.dimensions(), (3, 2));
            assert_eq!(im.get_pixel(2, 1).0, [12]);
        }
    }

    #[test]
    fn rejects_truncated_and_mismatched() {
        let labels = idx(&[2], &[0, 1]);
        let short = idx(&[2, 2, 2], &[0; 7]);
        let err = IdxDataset::from_bytes(&short, &labels, "short", vec![]).unwrap_err().to_string();
        assert!(err.contains("need Some(8) bytes, file has 7"), "{err}");
        let three = idx(&[3, 1, 1], &[0; 3]);
        let err = IdxDataset::from_bytes(&three, &labels, "n", vec![]).unwrap_err().to_string();
        assert!(err.contains("3 images but 2 labels"), "{err}");
        let err = parse_idx(b"PK\x03\x04", Path::new("zip")).unwrap_err().to_string();
        assert!(err.contains("magic"), "{err}");
    }
}
