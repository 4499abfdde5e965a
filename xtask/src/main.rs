//! Project chores: `cargo xtask data ...` prepares datasets, `cargo xtask test` runs the tests.

mod imports;
mod shards;

use anyhow::{Context, Result, bail};
use flate2::read::GzDecoder;
use flate2::write::GzEncoder;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

const DEBIAN_DIR: &str = "/usr/share/datasets/fashion-mnist";
const FILES: [&str; 4] = [
    "train-images-idx3-ubyte.gz",
    "train-labels-idx1-ubyte.gz",
    "t10k-images-idx3-ubyte.gz",
    "t10k-labels-idx1-ubyte.gz",
];
const CLASSES: [&str; 10] =
    ["T-shirt_top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt", "Sneaker", "Bag", "Ankle_boot"];
/// Images per class in the bundled subset.
const BUNDLE_PER_CLASS: usize = 1000;
/// Images per class in the bundled JPEG class-folder set.
const FOLDER_PER_CLASS: usize = 30;

const USAGE: &str = "usage: cargo xtask <command>
  test                      run every test of the workspace (the CI command)
  imports                   list import cycles between the files of burn-ddp and burn-vision,
                            and names imported through a re-export instead of where they live
  data fashion-mnist        copy the full Fashion-MNIST (60k/10k) into datasets/fashion-mnist
  data bundle               rebuild the bundled subset in datasets/ from Debian's package
  data flowers              print how to download TensorFlow's flower_photos
  data folder OUT [SIDE]    write the bundled 10k Fashion-MNIST images as SIDE×SIDE RGB JPEGs
                            (default 256) in class folders under OUT: a real-data input for
                            `burn-vision train --data OUT` and `burn-vision bench-data`
  data shards FOLDER OUT [PER_SHARD]
                            write a class folder as WebDataset tar shards (default 1000 samples
                            each, classes mixed) for `burn-vision train --data OUT`";

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    // Paths of `data shards` are the user's, relative to where the command runs (and the
    // workspace need not exist where its binary is carried).
    if let ["data", "shards", folder, out, rest @ ..] = args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        let per_shard = match rest {
            [] => shards::DEFAULT_PER_SHARD,
            [n] => n.parse().context("PER_SHARD must be a number of samples")?,
            _ => bail!("{USAGE}"),
        };
        return shards::write_shards(Path::new(folder), Path::new(out), per_shard).map(|_| ());
    }
    let root = workspace_root();
    std::env::set_current_dir(&root)?;
    match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["test", rest @ ..] => run(Command::new("cargo").args(["test", "--workspace"]).args(rest)),
        ["imports"] => import_cycles(&root),
        ["data", "fashion-mnist"] => fashion_mnist(),
        ["data", "bundle"] => bundle(),
        ["data", "folder", out] => folder(Path::new(out), 256),
        ["data", "folder", out, side] => {
            folder(Path::new(out), side.parse().context("SIDE must be a number of pixels")?)
        }
        ["data", "flowers"] => {
            println!("flower_photos needs internet access (3,670 JPEGs, 5 classes, 218 MiB):");
            println!(
                "  curl -L https://storage.googleapis.com/download.tensorflow.org/example_images/flower_photos.tgz | tar xz -C datasets/"
            );
            println!("  cargo run --release -p burn-vision -- train --data datasets/flower_photos --model resnet34");
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

/// Prints each crate's import cycles between files; fails when there is one.
fn import_cycles(root: &Path) -> Result<()> {
    let mut found = 0;
    for krate in ["burn-ddp", "burn-vision"] {
        let cycles = imports::cycles(&imports::graph(&root.join(krate).join("src"))?);
        for c in &cycles {
            println!("{krate}: {}", c.join(" <-> "));
        }
        found += cycles.len();
    }
    let mut upward = 0;
    for krate in ["burn-ddp", "burn-vision"] {
        for (module, path) in imports::through_reexports(&root.join(krate).join("src"))? {
            println!("{krate}: {module} imports {path} through a re-export");
            upward += 1;
        }
    }
    if found > 0 || upward > 0 {
        bail!("{found} import cycle(s), {upward} import(s) through a re-export");
    }
    println!("no import cycles, no imports through a re-export");
    Ok(())
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("xtask lives in the workspace").to_path_buf()
}

fn run(cmd: &mut Command) -> Result<()> {
    let status = cmd.status().with_context(|| format!("starting {cmd:?}"))?;
    if !status.success() {
        bail!("{cmd:?} failed with {status}");
    }
    Ok(())
}

fn source_dir() -> Result<PathBuf> {
    let dir = PathBuf::from(DEBIAN_DIR);
    if FILES.iter().all(|f| dir.join(f).is_file()) {
        return Ok(dir);
    }
    bail!(
        "Fashion-MNIST not found in {DEBIAN_DIR}; install it with `apt-get install dataset-fashion-mnist` \
         (Debian/Ubuntu), or download the four *-ubyte.gz files from the Fashion-MNIST GitHub repository into datasets/fashion-mnist/"
    )
}

fn fashion_mnist() -> Result<()> {
    let src = source_dir()?;
    let dst = PathBuf::from("datasets/fashion-mnist");
    std::fs::create_dir_all(&dst)?;
    for f in FILES {
        let bytes = std::fs::read(src.join(f))?;
        gunzip(&bytes).with_context(|| format!("{f} is not valid gzip"))?;
        std::fs::write(dst.join(f), &bytes)?;
        println!("{} ({} bytes)", dst.join(f).display(), bytes.len());
    }
    println!("ready: cargo run --release -p burn-vision -- train --data fashion-mnist");
    Ok(())
}

fn gunzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut out = Vec::new();
    GzDecoder::new(bytes).read_to_end(&mut out)?;
    Ok(out)
}

fn gzip(bytes: &[u8]) -> Result<Vec<u8>> {
    let mut enc = GzEncoder::new(Vec::new(), flate2::Compression::best());
    enc.write_all(bytes)?;
    Ok(enc.finish()?)
}

fn header(ndim: u8, dims: &[u32]) -> Vec<u8> {
    let mut out = vec![0, 0, 8, ndim];
    for d in dims {
        out.extend_from_slice(&d.to_be_bytes());
    }
    out
}

/// Builds datasets/fashion-mnist-10k (IDX, first 1,000 training images of each class, in file
/// order) and datasets/fashion-mnist-folder (the first 30 of those per class as JPEGs).
fn bundle() -> Result<()> {
    let src = source_dir()?;
    let images = gunzip(&std::fs::read(src.join(FILES[0]))?)?;
    let labels = gunzip(&std::fs::read(src.join(FILES[1]))?)?;
    let (pixels, labels) = (&images[16..], &labels[8..]);
    let mut counts = [0usize; 10];
    let (mut out_pixels, mut out_labels) = (Vec::new(), Vec::new());
    let folder = PathBuf::from("datasets/fashion-mnist-folder");
    let _ = std::fs::remove_dir_all(&folder);
    for (i, &label) in labels.iter().enumerate() {
        let c = label as usize;
        if counts[c] >= BUNDLE_PER_CLASS {
            continue;
        }
        let img = &pixels[i * 784..(i + 1) * 784];
        if counts[c] < FOLDER_PER_CLASS {
            let dir = folder.join(CLASSES[c]);
            std::fs::create_dir_all(&dir)?;
            let gray = image::GrayImage::from_raw(28, 28, img.to_vec()).expect("784 bytes");
            gray.save(dir.join(format!("train-{i:05}.jpg")))?;
        }
        counts[c] += 1;
        out_pixels.extend_from_slice(img);
        out_labels.push(label);
    }
    let n = out_labels.len() as u32;
    let dir = PathBuf::from("datasets/fashion-mnist-10k");
    std::fs::create_dir_all(&dir)?;
    let mut idx = header(3, &[n, 28, 28]);
    idx.extend_from_slice(&out_pixels);
    std::fs::write(dir.join("images-idx3-ubyte.gz"), gzip(&idx)?)?;
    let mut idx = header(1, &[n]);
    idx.extend_from_slice(&out_labels);
    std::fs::write(dir.join("labels-idx1-ubyte.gz"), gzip(&idx)?)?;
    println!("wrote {n} images to {} and {} JPEGs per class to {}", dir.display(), FOLDER_PER_CLASS, folder.display());
    Ok(())
}

/// Writes the bundled subset (datasets/fashion-mnist-10k) as `side`² RGB JPEGs in class folders.
fn folder(out: &Path, side: u32) -> Result<()> {
    let dir = PathBuf::from("datasets/fashion-mnist-10k");
    let images = gunzip(&std::fs::read(dir.join("images-idx3-ubyte.gz"))?)?;
    let labels = gunzip(&std::fs::read(dir.join("labels-idx1-ubyte.gz"))?)?;
    let (pixels, labels) = (&images[16..], &labels[8..]);
    for class in CLASSES {
        std::fs::create_dir_all(out.join(class))?;
    }
    for (i, &label) in labels.iter().enumerate() {
        let gray = image::GrayImage::from_raw(28, 28, pixels[i * 784..(i + 1) * 784].to_vec()).expect("784 bytes");
        let rgb = image::DynamicImage::ImageLuma8(gray)
            .resize_exact(side, side, image::imageops::FilterType::Triangle)
            .to_rgb8();
        rgb.save(out.join(CLASSES[label as usize]).join(format!("{i:05}.jpg")))?;
    }
    println!("wrote {} {side}x{side} JPEGs to {}", labels.len(), out.display());
    Ok(())
}
