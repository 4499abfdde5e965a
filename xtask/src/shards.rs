//! `cargo xtask data shards FOLDER OUT [PER_SHARD]`: a class folder (`FOLDER/CLASS/*.jpg`)
//! written as WebDataset tar shards that `burn-vision --data OUT` reads.
//!
//! Samples are shuffled once (a fixed seed) so every shard mixes the classes, as shard-level
//! shuffling during training needs; each sample is `KEY.jpg|jpeg|png` (the file's bytes as they
//! are, no re-encoding) followed by `KEY.cls` (its class number), and `classes.txt` names the
//! classes. Each shard is written under a temporary name and renamed when complete.

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};

/// Samples per shard unless the command line says otherwise.
pub const DEFAULT_PER_SHARD: usize = 1000;
const EXTENSIONS: [&str; 3] = ["jpg", "jpeg", "png"];

/// A class folder's images as (path, label), and its class names.
type Listing = (Vec<(PathBuf, usize)>, Vec<String>);

/// The class folder's images and classes: classes sorted by name, files by path, hidden
/// folders ignored (as burn-vision's FolderDataset lists them).
fn list_folder(root: &Path) -> Result<Listing> {
    let sorted = |dir: &Path| -> Result<Vec<PathBuf>> {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(dir)
            .with_context(|| format!("listing {}", dir.display()))?
            .map(|e| e.map(|e| e.path()))
            .collect::<std::io::Result<_>>()?;
        paths.sort();
        Ok(paths)
    };
    let (mut items, mut classes) = (Vec::new(), Vec::new());
    for dir in sorted(root)? {
        let name = dir.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if !dir.is_dir() || name.starts_with('.') {
            continue;
        }
        let before = items.len();
        for file in sorted(&dir)? {
            if extension(&file).is_some_and(|e| EXTENSIONS.contains(&e.as_str())) {
                items.push((file, classes.len()));
            }
        }
        if items.len() == before {
            bail!("class folder {} holds no .jpg/.jpeg/.png files; remove it or add images", dir.display());
        }
        classes.push(name);
    }
    if classes.is_empty() {
        bail!("{} holds no class sub-folders; expected FOLDER/CLASS_NAME/*.jpg", root.display());
    }
    Ok((items, classes))
}

fn extension(path: &Path) -> Option<String> {
    path.extension().and_then(|e| e.to_str()).map(str::to_ascii_lowercase)
}

/// A Fisher–Yates shuffle driven by SplitMix64 from `seed`: the same order on every machine.
fn shuffle<T>(items: &mut [T], seed: u64) {
    let mut state = seed;
    for i in (1..items.len()).rev() {
        state = state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        items.swap(i, ((z ^ (z >> 31)) % (i as u64 + 1)) as usize);
    }
}

/// Writes `folder`'s images as shards of `per_shard` samples into `out` (created; it must not
/// hold shards already). Returns the number of shards written.
pub fn write_shards(folder: &Path, out: &Path, per_shard: usize) -> Result<usize> {
    if per_shard == 0 {
        bail!("PER_SHARD must be at least 1");
    }
    if !folder.is_dir() {
        bail!("{} is not a folder; pass a class folder (FOLDER/CLASS_NAME/*.jpg)", folder.display());
    }
    let (mut items, classes) = list_folder(folder)?;
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let holds_tar = std::fs::read_dir(out)?.flatten().any(|e| e.path().extension().is_some_and(|x| x == "tar"));
    if holds_tar {
        bail!("{} already holds .tar shards; choose an empty folder (or remove them)", out.display());
    }
    shuffle(&mut items, 0);
    atomic_write(&out.join("classes.txt"), |f| {
        use std::io::Write;
        classes.iter().try_for_each(|c| writeln!(f, "{c}"))
    })?;
    let shards = items.len().div_ceil(per_shard);
    for (index, chunk) in items.chunks(per_shard).enumerate() {
        let path = out.join(format!("shard-{index:06}.tar"));
        let bytes = write_shard(&path, chunk, index * per_shard)?;
        println!("{} ({}/{shards}): {} samples, {:.1} MB", path.display(), index + 1, chunk.len(), bytes as f64 / 1e6);
    }
    println!(
        "wrote {} samples of {} classes in {shards} shards; train on them with --data '{}/shard-{{{:06}..{:06}}}.tar' (or --data {})",
        items.len(),
        classes.len(),
        out.display(),
        0,
        shards - 1,
        out.display()
    );
    Ok(shards)
}

/// One shard: each image's bytes and its `.cls`, keys numbered from `first_key`.
fn write_shard(path: &Path, items: &[(PathBuf, usize)], first_key: usize) -> Result<u64> {
    atomic_write(path, |file| {
        let mut builder = tar::Builder::new(file);
        for (i, (image, label)) in items.iter().enumerate() {
            let key = format!("{:08}", first_key + i);
            let ext = extension(image).expect("listed by extension");
            let bytes = std::fs::read(image)?;
            append(&mut builder, &format!("{key}.{ext}"), &bytes)?;
            append(&mut builder, &format!("{key}.cls"), label.to_string().as_bytes())?;
        }
        builder.finish()
    })?;
    Ok(std::fs::metadata(path)?.len())
}

fn append(builder: &mut tar::Builder<&mut std::fs::File>, name: &str, bytes: &[u8]) -> std::io::Result<()> {
    let mut header = tar::Header::new_ustar();
    header.set_size(bytes.len() as u64);
    header.set_mode(0o644);
    builder.append_data(&mut header, name, bytes)
}

/// Writes `path` through `write` into a temporary file beside it, renamed when complete.
fn atomic_write(path: &Path, write: impl FnOnce(&mut std::fs::File) -> std::io::Result<()>) -> Result<()> {
    let partial = path.with_extension("part");
    let mut file = std::fs::File::create(&partial).with_context(|| format!("creating {}", partial.display()))?;
    write(&mut file).and_then(|_| file.sync_all()).with_context(|| format!("writing {}", partial.display()))?;
    std::fs::rename(&partial, path).with_context(|| format!("renaming {} to {}", partial.display(), path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    #[test]
    fn shards_hold_every_image_once_with_its_class() {
        let dir = tempfile::tempdir().unwrap();
        let folder = dir.path().join("in");
        for (class, n) in [("b_class", 4), ("a_class", 3)] {
            std::fs::create_dir_all(folder.join(class)).unwrap();
            for i in 0..n {
                std::fs::write(folder.join(class).join(format!("{i}.JPG")), format!("{class}/{i}")).unwrap();
            }
        }
        std::fs::write(folder.join("a_class/notes.txt"), "not an image").unwrap();
        let out = dir.path().join("out");
        assert_eq!(write_shards(&folder, &out, 3).unwrap(), 3);
        assert_eq!(std::fs::read_to_string(out.join("classes.txt")).unwrap(), "a_class\nb_class\n");
        let mut seen = Vec::new();
        for shard in 0..3 {
            let file = std::fs::File::open(out.join(format!("shard-{shard:06}.tar"))).unwrap();
            let mut archive = tar::Archive::new(file);
            let mut members: Vec<(String, String)> = Vec::new();
            for entry in archive.entries().unwrap() {
                let mut entry = entry.unwrap();
                let mut text = String::new();
                entry.read_to_string(&mut text).unwrap();
                members.push((entry.path().unwrap().display().to_string(), text));
            }
            for pair in members.chunks(2) {
                let (image, cls) = (&pair[0], &pair[1]);
                assert_eq!(image.0.trim_end_matches(".jpg"), cls.0.trim_end_matches(".cls"));
                let class = ["a_class", "b_class"][cls.1.parse::<usize>().unwrap()];
                assert!(image.1.starts_with(class), "{} labelled {class}", image.1);
                seen.push(image.1.clone());
            }
        }
        seen.sort();
        assert_eq!(seen.len(), 7);
        seen.dedup();
        assert_eq!(seen.len(), 7);
        let again = write_shards(&folder, &out, 3).unwrap_err().to_string();
        assert!(again.contains("already holds .tar shards"), "{again}");
        assert!(!out.join("shard-000000.part").exists());
    }
}
