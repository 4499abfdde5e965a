//! A data set stored as WebDataset tar shards: `shard-000000.tar`, … each holding samples as
//! consecutive members that share a key (`00001234.jpg` + `00001234.cls`), read front to back.
//!
//! Opening reads every shard's headers (not its images) into an index, so samples are also
//! readable by position (validation, prediction); training reads them in shard order through
//! burn-ddp's `ShardSampler`. `cargo xtask data shards FOLDER OUT` writes such shards from a
//! class folder.

use super::Dataset;
use super::folder::{IMAGE_EXTENSIONS, decode_bytes};
use crate::error::{Error, Result};
use image::DynamicImage;
use rayon::prelude::*;
use std::cell::RefCell;
use std::collections::VecDeque;
use std::fs::File;
use std::io::{BufReader, Read, Seek, SeekFrom};
use std::ops::Range;
use std::path::{Path, PathBuf};

/// The optional file beside the shards naming the classes, one per line, line i for label i.
pub const CLASSES_FILE: &str = "classes.txt";

/// One sample: where its image member lies in which shard, and its label.
#[derive(Debug, Clone)]
struct Sample {
    shard: usize,
    offset: u64,
    len: u64,
    label: usize,
    /// The image member's name in the shard.
    name: String,
}

/// Samples from tar shards, indexed in shard order and, inside a shard, in member order.
#[derive(Debug, Clone)]
pub struct ShardDataset {
    shards: Vec<PathBuf>,
    samples: Vec<Sample>,
    ranges: Vec<Range<usize>>,
    classes: Vec<String>,
}

/// Whether `spec` names tar shards rather than a class folder: a `.tar` file, a brace range
/// (`shard-{000000..000099}.tar`), or a folder holding `.tar` files.
pub fn is_shard_spec(spec: &str) -> bool {
    spec.ends_with(".tar") || (spec.contains('{') && spec.contains(".tar")) || !tar_files_in(Path::new(spec)).is_empty()
}

fn tar_files_in(dir: &Path) -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut tars: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "tar"))
        .collect();
    tars.sort();
    tars
}

/// The shard files `spec` names, in order: a brace range `prefix{first..last}suffix` (the
/// width of `first` kept, as WebDataset and bash expand it), a folder's `*.tar` files sorted by
/// name, or one file.
///
/// # Errors
/// [`Error::BadShard`] for a malformed range, a named shard that does not exist, or a folder
/// without `.tar` files.
pub fn expand_spec(spec: &str) -> Result<Vec<PathBuf>> {
    let bad = |reason: String| Error::BadShard { path: PathBuf::from(spec), reason };
    let paths = if let Some((prefix, rest)) = spec.split_once('{') {
        let (range, suffix) = rest.split_once('}').ok_or_else(|| bad("a `{` without its `}`".into()))?;
        let (first, last) = range.split_once("..").ok_or_else(|| bad(format!("`{{{range}}}` is not FIRST..LAST")))?;
        let number = |s: &str| s.parse::<u64>().map_err(|_| bad(format!("`{s}` in `{{{range}}}` is not a number")));
        let (a, b) = (number(first)?, number(last)?);
        if a > b {
            return Err(bad(format!("the range `{{{range}}}` is empty")));
        }
        (a..=b).map(|i| PathBuf::from(format!("{prefix}{i:0width$}{suffix}", width = first.len()))).collect()
    } else if Path::new(spec).is_dir() {
        let tars = tar_files_in(Path::new(spec));
        if tars.is_empty() {
            return Err(bad("the folder holds no .tar files".into()));
        }
        tars
    } else {
        vec![PathBuf::from(spec)]
    };
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        return Err(Error::BadShard { path: missing.clone(), reason: "does not exist".into() });
    }
    Ok(paths)
}

impl ShardDataset {
    /// Indexes the shards `spec` names ([`expand_spec`]); class names come from
    /// [`CLASSES_FILE`] beside the first shard, else they are the labels' numbers.
    ///
    /// # Errors
    /// [`Error::BadShard`] naming the shard for a missing or truncated shard, a sample without
    /// an image or a `.cls` member, a label that is not a number or has no class name; I/O
    /// errors while reading.
    pub fn open(spec: &str) -> Result<Self> {
        let shards = expand_spec(spec)?;
        let indexed: Vec<Vec<Sample>> =
            shards.par_iter().enumerate().map(|(i, path)| index_shard(i, path)).collect::<Result<_>>()?;
        let mut ranges = Vec::with_capacity(indexed.len());
        let mut samples = Vec::new();
        for shard in indexed {
            ranges.push(samples.len()..samples.len() + shard.len());
            samples.extend(shard);
        }
        if samples.is_empty() {
            return Err(Error::BadShard { path: PathBuf::from(spec), reason: "the shards hold no samples".into() });
        }
        let classes = class_names(&shards[0], &samples)?;
        Ok(Self { shards, samples, ranges, classes })
    }

    /// The shard files, in order.
    pub fn shard_paths(&self) -> &[PathBuf] {
        &self.shards
    }

    /// The raw bytes of sample `index`'s image member.
    ///
    /// # Errors
    /// When the shard cannot be read.
    pub fn read(&self, index: usize) -> Result<Vec<u8>> {
        let sample = &self.samples[index];
        let mut bytes = vec![0; sample.len as usize];
        read_at(&self.shards[sample.shard], sample.offset, &mut bytes)?;
        Ok(bytes)
    }
}

/// Shards each reading thread keeps open, its most recently read first: a rank reads shard
/// after shard, so a thread opens a shard once per pass over it rather than once per sample (on
/// shared storage an open costs a round trip to the metadata server), and the open files stay
/// few (threads × this) however many shards there are.
const OPEN_PER_THREAD: usize = 4;

thread_local! {
    static OPEN_SHARDS: RefCell<VecDeque<(PathBuf, File)>> = const { RefCell::new(VecDeque::new()) };
}

/// Fills `buf` from `path` at `offset`, through this thread's open shards.
fn read_at(path: &Path, offset: u64, buf: &mut [u8]) -> Result<()> {
    OPEN_SHARDS.with(|open| {
        let mut open = open.borrow_mut();
        let mut file = match open.iter().position(|(p, _)| p == path) {
            Some(i) => open.remove(i).expect("position found").1,
            None => File::open(path).map_err(|e| Error::io("opening", path, e))?,
        };
        let read = file.seek(SeekFrom::Start(offset)).and_then(|_| file.read_exact(buf));
        read.map_err(|e| Error::io("reading", path, e))?;
        open.push_front((path.to_path_buf(), file));
        open.truncate(OPEN_PER_THREAD);
        Ok(())
    })
}

/// The samples of `subset` (ascending dataset indices, e.g. the training split) grouped by
/// the shard holding them, in reading order: the input of burn-ddp's `ShardSampler`.
pub fn samples_by_shard(ranges: &[Range<usize>], subset: &[usize]) -> Vec<Vec<usize>> {
    debug_assert!(subset.windows(2).all(|w| w[0] < w[1]), "subset must be ascending");
    ranges
        .iter()
        .map(|range| {
            let start = subset.partition_point(|&i| i < range.start);
            let end = subset.partition_point(|&i| i < range.end);
            subset[start..end].to_vec()
        })
        .collect()
}

/// A member's key and extension, WebDataset's way: the name up to the first dot of its last
/// path component, and the (lower-cased) rest.
fn split_member_name(name: &str) -> Option<(&str, String)> {
    let base_at = name.rfind('/').map_or(0, |i| i + 1);
    let dot = base_at + name[base_at..].find('.')?;
    Some((&name[..dot], name[dot + 1..].to_ascii_lowercase()))
}

/// A sample being gathered from consecutive members with one key.
#[derive(Default)]
struct Pending {
    key: String,
    image: Option<(u64, u64, String)>,
    label: Option<usize>,
}

impl Pending {
    fn finish(self, shard: usize, path: &Path) -> Result<Option<Sample>> {
        if self.key.is_empty() {
            return Ok(None);
        }
        let bad =
            |what: &str| Error::BadShard { path: path.to_path_buf(), reason: format!("sample `{}` {what}", self.key) };
        let (offset, len, name) = self.image.ok_or_else(|| bad("has no .jpg/.jpeg/.png member"))?;
        let label = self.label.ok_or_else(|| bad("has no .cls member (its class number)"))?;
        Ok(Some(Sample { shard, offset, len, label, name }))
    }
}

/// Reads one shard's headers (and its small `.cls` members) into samples.
fn index_shard(shard: usize, path: &Path) -> Result<Vec<Sample>> {
    let bad = |reason: String| Error::BadShard { path: path.to_path_buf(), reason };
    let file = File::open(path).map_err(|e| Error::io("opening", path, e))?;
    let file_len = file.metadata().map_err(|e| Error::io("reading", path, e))?.len();
    let mut archive = tar::Archive::new(BufReader::new(file));
    let entries = archive.entries_with_seek().map_err(|e| bad(e.to_string()))?;
    let (mut samples, mut pending, mut end) = (Vec::new(), Pending::default(), 0u64);
    for entry in entries {
        let mut entry = entry.map_err(|e| bad(format!("{e} (a truncated or corrupt tar file)")))?;
        let (offset, len) = (entry.raw_file_position(), entry.size());
        end = offset + len.div_ceil(512) * 512;
        if offset + len > file_len {
            return Err(bad(format!(
                "truncated: a member's data runs to byte {} of a {file_len}-byte file; copy or write the shard again",
                offset + len
            )));
        }
        if !entry.header().entry_type().is_file() {
            continue;
        }
        let name = String::from_utf8_lossy(&entry.path_bytes()).into_owned();
        let Some((key, ext)) = split_member_name(&name) else { continue };
        if key != pending.key {
            samples.extend(
                std::mem::replace(&mut pending, Pending { key: key.to_string(), ..Default::default() })
                    .finish(shard, path)?,
            );
        }
        if IMAGE_EXTENSIONS.contains(&ext.as_str()) {
            pending.image = Some((offset, len, name));
        } else if ext == "cls" {
            let mut text = String::new();
            entry.read_to_string(&mut text).map_err(|e| bad(format!("reading {name}: {e}")))?;
            let label =
                text.trim().parse().map_err(|_| bad(format!("{name} holds `{}`, not a class number", text.trim())))?;
            pending.label = Some(label);
        }
    }
    samples.extend(pending.finish(shard, path)?);
    check_end_marker(path, end, file_len)?;
    Ok(samples)
}

/// A shard cut between two members reads as a shorter whole one; its missing end-of-archive
/// marker (two zero blocks after the last member) gives the cut away.
fn check_end_marker(path: &Path, end: u64, file_len: u64) -> Result<()> {
    let mut marker = [0u8; 1024];
    let read = File::open(path)
        .and_then(|mut f| f.seek(SeekFrom::Start(end)).and_then(|_| f.read_exact(&mut marker)))
        .map(|_| marker.iter().all(|&b| b == 0));
    if read.unwrap_or(false) {
        return Ok(());
    }
    Err(Error::BadShard {
        path: path.to_path_buf(),
        reason: format!(
            "truncated: no end-of-archive marker after the last member (byte {end} of {file_len}); copy or write the shard again"
        ),
    })
}

fn class_names(first_shard: &Path, samples: &[Sample]) -> Result<Vec<String>> {
    let count = samples.iter().map(|s| s.label).max().map_or(0, |m| m + 1);
    let file = first_shard.parent().unwrap_or(Path::new(".")).join(CLASSES_FILE);
    let Ok(text) = std::fs::read_to_string(&file) else {
        return Ok((0..count).map(|i| i.to_string()).collect());
    };
    let names: Vec<String> = text.lines().map(str::trim).filter(|l| !l.is_empty()).map(String::from).collect();
    if names.len() < count {
        return Err(Error::BadShard {
            path: file,
            reason: format!("names {} classes but the shards use labels up to {}", names.len(), count - 1),
        });
    }
    Ok(names)
}

impl Dataset for ShardDataset {
    fn len(&self) -> usize {
        self.samples.len()
    }
    fn label(&self, index: usize) -> usize {
        self.samples[index].label
    }
    fn load(&self, index: usize) -> Result<DynamicImage> {
        let bytes = self.read(index)?;
        decode_bytes(bytes).map_err(|reason| Error::BadImage { path: PathBuf::from(self.describe(index)), reason })
    }
    fn read_bytes(&self, index: usize) -> Option<Result<Vec<u8>>> {
        Some(self.read(index))
    }
    fn describe(&self, index: usize) -> String {
        let sample = &self.samples[index];
        format!("{}:{}", self.shards[sample.shard].display(), sample.name)
    }
    fn classes(&self) -> &[String] {
        &self.classes
    }
    fn shards(&self) -> Option<&[Range<usize>]> {
        Some(&self.ranges)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(shade: u8) -> Vec<u8> {
        let mut out = std::io::Cursor::new(Vec::new());
        image::GrayImage::from_pixel(6, 4, image::Luma([shade])).write_to(&mut out, image::ImageFormat::Png).unwrap();
        out.into_inner()
    }

    /// Writes a shard of `(member name, bytes)` in order.
    fn write_shard(path: &Path, members: &[(&str, Vec<u8>)]) {
        let mut builder = tar::Builder::new(std::fs::File::create(path).unwrap());
        for (name, bytes) in members {
            let mut header = tar::Header::new_gnu();
            header.set_size(bytes.len() as u64);
            header.set_mode(0o644);
            builder.append_data(&mut header, name, bytes.as_slice()).unwrap();
        }
        builder.finish().unwrap();
    }

    fn sample(key: &str, shade: u8, label: usize) -> [(String, Vec<u8>); 2] {
        [(format!("{key}.png"), png(shade)), (format!("{key}.cls"), label.to_string().into_bytes())]
    }

    fn write_samples(path: &Path, samples: &[(&str, u8, usize)]) {
        let members: Vec<(String, Vec<u8>)> = samples.iter().flat_map(|&(k, s, l)| sample(k, s, l)).collect();
        let refs: Vec<(&str, Vec<u8>)> = members.iter().map(|(n, b)| (n.as_str(), b.clone())).collect();
        write_shard(path, &refs);
    }

    fn two_shards(dir: &Path) {
        write_samples(&dir.join("s-0008.tar"), &[("a", 10, 1), ("b", 20, 0), ("c", 30, 1)]);
        write_samples(&dir.join("s-0009.tar"), &[("dir/d", 40, 2), ("e", 50, 0)]);
    }

    #[test]
    fn indexes_samples_in_shard_and_member_order() {
        let dir = tempfile::tempdir().unwrap();
        two_shards(dir.path());
        std::fs::write(dir.path().join(CLASSES_FILE), "cat\ndog\nemu\n").unwrap();
        let spec = format!("{}/s-{{0008..0009}}.tar", dir.path().display());
        let ds = ShardDataset::open(&spec).unwrap();
        assert_eq!(ds.len(), 5);
        assert_eq!(ds.shards().unwrap(), [0..3, 3..5]);
        assert_eq!((0..5).map(|i| ds.label(i)).collect::<Vec<_>>(), [1, 0, 1, 2, 0]);
        assert_eq!(ds.classes(), ["cat", "dog", "emu"]);
        let shades: Vec<u8> = (0..5).map(|i| ds.load(i).unwrap().to_luma8().get_pixel(0, 0).0[0]).collect();
        assert_eq!(shades, [10, 20, 30, 40, 50]);
        assert!(ds.describe(3).ends_with("s-0009.tar:dir/d.png"), "{}", ds.describe(3));
        let by_folder = ShardDataset::open(&dir.path().display().to_string()).unwrap();
        assert_eq!(by_folder.len(), 5);
        assert_eq!(by_folder.classes(), ["cat", "dog", "emu"]);
    }

    #[test]
    fn reads_through_more_shards_than_a_thread_keeps_open() {
        let dir = tempfile::tempdir().unwrap();
        for shard in 0..(OPEN_PER_THREAD as u8 + 3) {
            let (a, b) = (format!("{shard}a"), format!("{shard}b"));
            write_samples(&dir.path().join(format!("{shard}.tar")), &[(&a, 10 * shard, 0), (&b, 10 * shard + 1, 0)]);
        }
        let ds = ShardDataset::open(&dir.path().display().to_string()).unwrap();
        // Back and forth over every shard: each read must come from its own shard and offset.
        let order: Vec<usize> = (0..ds.len()).step_by(2).chain((1..ds.len()).step_by(2).rev()).collect();
        for i in order {
            let shade = ds.load(i).unwrap().to_luma8().get_pixel(0, 0).0[0];
            assert_eq!(usize::from(shade), 10 * (i / 2) + i % 2, "sample {i}");
        }
    }

    #[test]
    fn without_a_classes_file_labels_name_themselves() {
        let dir = tempfile::tempdir().unwrap();
        two_shards(dir.path());
        let ds = ShardDataset::open(&dir.path().join("s-0008.tar").display().to_string()).unwrap();
        assert_eq!(ds.len(), 3);
        assert_eq!(ds.classes(), ["0", "1"]);
        std::fs::write(dir.path().join(CLASSES_FILE), "cat\n").unwrap();
        let err = ShardDataset::open(&dir.path().display().to_string()).unwrap_err().to_string();
        assert!(err.contains("names 1 classes") && err.contains("up to 2"), "{err}");
    }

    #[test]
    fn every_cut_of_a_shard_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        two_shards(dir.path());
        let whole = std::fs::read(dir.path().join("s-0008.tar")).unwrap();
        let cut = dir.path().join("cut.tar");
        // Cuts inside a header, inside data, between members and inside the end marker.
        for at in (1..whole.len()).step_by(97).chain([512, 1024, 1536, whole.len() - 512]) {
            std::fs::write(&cut, &whole[..at]).unwrap();
            let err = ShardDataset::open(&cut.display().to_string()).map(|d| d.len()).unwrap_err().to_string();
            assert!(err.contains("cut.tar"), "cut at {at}: {err}");
        }
    }

    #[test]
    fn malformed_samples_and_specs_are_one_line_errors() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("x.tar");
        let open = |members: &[(&str, Vec<u8>)]| {
            write_shard(&shard, members);
            ShardDataset::open(&shard.display().to_string()).unwrap_err().to_string()
        };
        let err = open(&[("k.png", png(1)), ("k.json", b"{}".to_vec())]);
        assert!(err.contains("`k` has no .cls"), "{err}");
        let err = open(&[("k.cls", b"3".to_vec())]);
        assert!(err.contains("`k` has no .jpg"), "{err}");
        let err = open(&[("k.png", png(1)), ("k.cls", b"three".to_vec())]);
        assert!(err.contains("not a class number"), "{err}");
        let missing = format!("{}/s-{{0001..0002}}.tar", dir.path().display());
        assert!(ShardDataset::open(&missing).unwrap_err().to_string().contains("s-0001.tar: does not exist"));
        let backwards = format!("{}/s-{{9..2}}.tar", dir.path().display());
        assert!(ShardDataset::open(&backwards).unwrap_err().to_string().contains("empty"));
        let empty = tempfile::tempdir().unwrap();
        assert!(expand_spec(&empty.path().display().to_string()).unwrap_err().to_string().contains("no .tar files"));
    }

    #[test]
    fn a_corrupt_image_is_a_decode_error_of_that_sample_only() {
        let dir = tempfile::tempdir().unwrap();
        let shard = dir.path().join("x.tar");
        write_shard(
            &shard,
            &[("a.jpg", b"not a jpeg".to_vec()), ("a.cls", b"0".to_vec()), ("b.png", png(9)), ("b.cls", b"0".to_vec())],
        );
        let ds = ShardDataset::open(&shard.display().to_string()).unwrap();
        assert!(matches!(ds.load(0), Err(Error::BadImage { .. })));
        assert_eq!(ds.load(1).unwrap().width(), 6);
    }

    #[test]
    fn a_subset_groups_by_shard_in_reading_order() {
        assert_eq!(samples_by_shard(&[0..3, 3..3, 3..6], &[1, 2, 3, 5, 7]), [vec![1, 2], vec![], vec![3, 5]]);
    }

    #[test]
    fn keys_stop_at_the_first_dot_of_the_file_name() {
        assert_eq!(split_member_name("d.1/a.seg.PNG"), Some(("d.1/a", "seg.png".to_string())));
        assert_eq!(split_member_name("README"), None);
    }

    #[test]
    fn brace_ranges_keep_their_width() {
        let dir = tempfile::tempdir().unwrap();
        for i in 98..=101 {
            write_samples(&dir.path().join(format!("p-{i:03}.tar")), &[("a", 1, 0)]);
        }
        let paths = expand_spec(&format!("{}/p-{{098..101}}.tar", dir.path().display())).unwrap();
        let names: Vec<_> = paths.iter().map(|p| p.file_name().unwrap().to_str().unwrap().to_string()).collect();
        assert_eq!(names, ["p-098.tar", "p-099.tar", "p-100.tar", "p-101.tar"]);
        assert!(is_shard_spec(&dir.path().display().to_string()));
        assert!(!is_shard_spec("datasets/fashion-mnist-folder"));
    }
}
