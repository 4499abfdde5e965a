//! An image-folder dataset in the flower_photos layout: `ROOT/CLASS_NAME/*.jpg|png`.

use super::Dataset;
use crate::error::{Error, Result};
use image::{DynamicImage, ImageReader};
use std::path::{Path, PathBuf};

/// File extensions that are read as images (compared lower-case).
pub const IMAGE_EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// Images listed (not decoded) from one folder per class; classes sorted by name, files sorted
/// by path, so label numbering and order are the same on every machine.
#[derive(Debug, Clone)]
pub struct FolderDataset {
    items: Vec<(PathBuf, usize)>,
    classes: Vec<String>,
}

/// Whether `path` names an image file (by its extension, [`IMAGE_EXTENSIONS`]).
pub fn is_image(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| IMAGE_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

fn sorted_entries(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).map_err(|e| Error::io("listing", dir, e))? {
        out.push(entry.map_err(|e| Error::io("listing", dir, e))?.path());
    }
    out.sort();
    Ok(out)
}

impl FolderDataset {
    /// Lists `root`: every sub-folder is a class, every image file inside it a sample.
    /// Hidden folders (starting with `.`) are ignored.
    ///
    /// # Errors
    /// [`Error::MissingDataDir`] if `root` is absent, [`Error::NoClasses`] if it holds no
    /// folders, [`Error::EmptyClass`] for a class folder without image files.
    pub fn open(root: &Path) -> Result<Self> {
        if !root.is_dir() {
            return Err(Error::MissingDataDir { path: root.to_path_buf() });
        }
        let mut classes = Vec::new();
        let mut items = Vec::new();
        for class_dir in sorted_entries(root)? {
            let name = class_dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
            if !class_dir.is_dir() || name.starts_with('.') {
                continue;
            }
            let label = classes.len();
            let files: Vec<PathBuf> = sorted_entries(&class_dir)?.into_iter().filter(|p| is_image(p)).collect();
            if files.is_empty() {
                return Err(Error::EmptyClass { path: class_dir });
            }
            items.extend(files.into_iter().map(|p| (p, label)));
            classes.push(name);
        }
        if classes.is_empty() {
            return Err(Error::NoClasses { path: root.to_path_buf() });
        }
        Ok(Self { items, classes })
    }

    /// The path of sample `index`.
    pub fn path(&self, index: usize) -> &Path {
        &self.items[index].0
    }
}

/// Decodes one image file, detecting the format from its content rather than its name.
///
/// # Errors
/// [`Error::BadImage`] for empty, truncated, corrupt or unsupported files.
pub fn decode_file(path: &Path) -> Result<DynamicImage> {
    let bad = |reason: String| Error::BadImage { path: path.to_path_buf(), reason };
    let bytes = std::fs::read(path).map_err(|e| Error::io("reading", path, e))?;
    decode_bytes(bytes).map_err(bad)
}

/// Decodes an image file's bytes (JPEG, PNG), refusing a JPEG cut short (the decoder alone
/// would fill the missing part with grey). A decoder that panics on crafted bytes is an error.
///
/// # Errors
/// The reason, for empty, truncated, corrupt or unsupported bytes.
pub fn decode_bytes(bytes: Vec<u8>) -> std::result::Result<DynamicImage, String> {
    if bytes.is_empty() {
        return Err("file is empty (0 bytes)".into());
    }
    if bytes.starts_with(&[0xFF, 0xD8, 0xFF]) {
        burn_ddp::nn::jpeg::check_whole(&bytes)?;
    }
    let reader = ImageReader::new(std::io::Cursor::new(bytes)).with_guessed_format().map_err(|e| e.to_string())?;
    crate::guard::catch_panic(|| reader.decode())
        .map_err(|p| format!("the decoder failed: {p}"))?
        .map_err(|e| e.to_string())
}

impl Dataset for FolderDataset {
    fn len(&self) -> usize {
        self.items.len()
    }
    fn label(&self, index: usize) -> usize {
        self.items[index].1
    }
    fn load(&self, index: usize) -> Result<DynamicImage> {
        decode_file(&self.items[index].0)
    }
    fn read_bytes(&self, index: usize) -> Option<Result<Vec<u8>>> {
        let path = &self.items[index].0;
        Some(std::fs::read(path).map_err(|e| Error::io("reading", path, e)))
    }
    fn describe(&self, index: usize) -> String {
        self.items[index].0.display().to_string()
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(path: &Path, rgba: bool) {
        if rgba {
            image::RgbaImage::from_pixel(8, 6, image::Rgba([10, 20, 30, 128])).save(path).unwrap();
        } else {
            image::GrayImage::from_pixel(8, 6, image::Luma([77])).save(path).unwrap();
        }
    }

    #[test]
    fn lists_sorted_classes_and_files() {
        let dir = tempfile::tempdir().unwrap();
        for (class, n) in [("tulips", 2), ("daisy", 3)] {
            std::fs::create_dir(dir.path().join(class)).unwrap();
            for i in 0..n {
                write_png(&dir.path().join(class).join(format!("{i}.png")), i % 2 == 0);
            }
        }
        std::fs::write(dir.path().join("daisy/notes.txt"), "x").unwrap();
        std::fs::create_dir(dir.path().join(".cache")).unwrap();
        let ds = FolderDataset::open(dir.path()).unwrap();
        assert_eq!(ds.classes(), ["daisy", "tulips"]);
        assert_eq!(ds.len(), 5);
        assert_eq!(ds.label(0), 0);
        assert_eq!(ds.label(4), 1);
        assert_eq!(ds.load(0).unwrap().width(), 8);
    }

    #[test]
    fn errors_name_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let missing = FolderDataset::open(&dir.path().join("nope")).unwrap_err().to_string();
        assert!(missing.contains("does not exist"), "{missing}");
        let none = FolderDataset::open(dir.path()).unwrap_err().to_string();
        assert!(none.contains("no class sub-folders"), "{none}");
        std::fs::create_dir(dir.path().join("empty")).unwrap();
        let empty = FolderDataset::open(dir.path()).unwrap_err().to_string();
        assert!(empty.contains("empty") && empty.contains("no .jpg"), "{empty}");
    }

    #[test]
    fn corrupt_files_are_errors_not_panics() {
        let dir = tempfile::tempdir().unwrap();
        let zero = dir.path().join("zero.jpg");
        std::fs::write(&zero, b"").unwrap();
        assert!(decode_file(&zero).unwrap_err().to_string().contains("0 bytes"));
        let garbage = dir.path().join("garbage.png");
        std::fs::write(&garbage, b"definitely not an image at all").unwrap();
        assert!(matches!(decode_file(&garbage), Err(Error::BadImage { .. })));
        let good = dir.path().join("good.png");
        write_png(&good, false);
        let bytes = std::fs::read(&good).unwrap();
        let truncated = dir.path().join("truncated.png");
        std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
        assert!(matches!(decode_file(&truncated), Err(Error::BadImage { .. })));
    }
}
