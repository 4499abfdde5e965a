//! Every decoder of files ends in an error, never a panic, whatever the bytes: checkpoints
//! (their records mutated *and the checksum recomputed*, so the record parser itself is
//! exercised, and another model's record under a valid checksum), PyTorch `.pth` files (the
//! pickle inside the zip mutated and the zip written anew with valid CRCs), `.safetensors`
//! headers, and JPEG / PNG images (PNG chunks with their CRCs recomputed).

use burn::record::{BinBytesRecorder, FullPrecisionSettings, Recorder};
use burn_flex::Flex;
use burn_vision::data::folder::decode_bytes;
use burn_vision::model::{Classifier, create};
use burn_vision::train::checkpoint::{Checkpoint, CheckpointMeta};
use burn_vision::train::inference::predict::restore;
use burn_vision::weights::golden::arch_config;
use burn_vision::weights::load_pretrained;
use proptest::prelude::*;
use std::io::{Read, Write};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights")
}

fn record_bytes(model: Classifier<Flex>) -> Vec<u8> {
    use burn::module::Module;
    BinBytesRecorder::<FullPrecisionSettings>::default().record(model.into_record(), ()).unwrap()
}

fn checkpoint(model_name: &str, record: Vec<u8>) -> Checkpoint {
    let meta = CheckpointMeta {
        model: model_name.into(),
        classes: (0..4).map(|c| c.to_string()).collect(),
        in_channels: 1,
        small_input: true,
        image_size: 28,
        epoch: 1,
        step: 10,
        best_acc: 0.5,
        val_acc: 0.5,
        config: serde_json::json!({}),
        batches_tracked: None,
        partial: None,
    };
    Checkpoint { meta, model: record, optimizer: Vec::new() }
}

/// Restores `ck` from a file; a panic fails the test, an error is its one line.
fn restore_outcome(ck: &Checkpoint) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("crafted.ckpt");
    ck.save(&path).unwrap();
    match catch_unwind(AssertUnwindSafe(|| restore::<Flex>(&path, &Default::default()).map(|_| ()))) {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => panic!("restoring a crafted checkpoint panicked"),
    }
}

fn small_record() -> Vec<u8> {
    record_bytes(create::<Flex>("resnet10-mini", 4, 1, true, &Default::default()).unwrap())
}

#[test]
fn another_models_record_under_a_valid_checksum_is_a_one_line_error() {
    let device = Default::default();
    let whole = checkpoint("resnet10-mini", small_record());
    assert_eq!(restore_outcome(&whole), Ok(()), "the untouched checkpoint must load");
    for (claimed, actual) in [
        ("resnet10-mini", create::<Flex>("vit-mini", 4, 1, true, &device).unwrap()),
        ("resnet10-mini", create::<Flex>("resnet18", 4, 1, true, &device).unwrap()),
    ] {
        let err = restore_outcome(&checkpoint(claimed, record_bytes(actual))).unwrap_err();
        assert!(err.contains("crafted.ckpt") && err.contains("unusable"), "{err}");
        assert!(!err.contains('\n'), "not one line: {err}");
    }
    let vit_meta_resnet_record = checkpoint("vit-mini", small_record());
    assert!(restore_outcome(&vit_meta_resnet_record).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    /// Bytes of the model record changed, cut or inserted; the checkpoint's checksum is
    /// computed over the changed record, so only the record parser stands between them and the
    /// model.
    #[test]
    fn mutated_records_with_valid_checksums_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6)) {
        let mut record = small_record();
        for (at, byte, kind) in edits {
            let i = at.index(record.len());
            match kind {
                0 => record[i] = byte,
                1 => record.truncate(i.max(1)),
                _ => record.insert(i, byte),
            }
        }
        let _ = restore_outcome(&checkpoint("resnet10-mini", record));
    }
}

/// The `.pth` fixture with its `data.pkl` changed by `edit`, written as a new zip (valid CRCs).
fn pth_with_pickle(edit: impl Fn(&mut Vec<u8>)) -> Vec<u8> {
    let bytes = std::fs::read(fixtures().join("tv_small_basic.pth")).unwrap();
    let mut archive = zip::ZipArchive::new(std::io::Cursor::new(bytes)).unwrap();
    let mut out = zip::ZipWriter::new(std::io::Cursor::new(Vec::new()));
    let stored = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for i in 0..archive.len() {
        let mut member = archive.by_index(i).unwrap();
        let name = member.name().to_string();
        let mut data = Vec::new();
        member.read_to_end(&mut data).unwrap();
        if name.ends_with("data.pkl") {
            edit(&mut data);
        }
        out.start_file(name, stored).unwrap();
        out.write_all(&data).unwrap();
    }
    out.finish().unwrap().into_inner()
}

/// Loads weight-file `bytes` (named `name`) into the fixture's model: error or not, no panic.
fn load_outcome(arch: &str, name: &str, bytes: &[u8]) -> Result<(), String> {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(name);
    std::fs::write(&path, bytes).unwrap();
    let model = arch_config(arch, 10, 3).unwrap().init::<Flex>(&Default::default());
    match catch_unwind(AssertUnwindSafe(|| load_pretrained(model, arch, &path).map(|_| ()))) {
        Ok(result) => result.map_err(|e| e.to_string()),
        Err(_) => panic!("loading crafted weights {name} panicked"),
    }
}

#[test]
fn the_rezipped_pickle_is_read_when_unchanged() {
    assert_eq!(load_outcome("tv_small_basic", "same.pth", &pth_with_pickle(|_| {})), Ok(()));
}

/// A parameter name with a line break in it (found by the fuzzing below): the file's names are
/// listed escaped, so the error stays on one line and still names the parameter.
#[test]
fn a_name_with_a_line_break_is_listed_on_one_line() {
    let bytes = pth_with_pickle(|pickle| {
        let name = b"layer3.0.bn2.num_batches_tracked";
        let at = pickle.windows(name.len()).position(|w| w == name).expect("the fixture names layer3.0.bn2");
        pickle[at] = b'\n';
    });
    let e = load_outcome("tv_small_basic", "crafted.pth", &bytes).unwrap_err();
    assert!(!e.contains('\n') && e.contains("\\nayer3.0.bn2.num_batches_tracked"), "{e}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_pickles_in_valid_zips_never_panic(edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4), cut in any::<Option<prop::sample::Index>>()) {
        let bytes = pth_with_pickle(|pickle| {
            for (at, byte) in &edits {
                let i = at.index(pickle.len());
                pickle[i] = *byte;
            }
            if let Some(cut) = cut {
                pickle.truncate(cut.index(pickle.len()));
            }
        });
        if let Err(e) = load_outcome("tv_small_basic", "crafted.pth", &bytes) {
            prop_assert!(!e.contains('\n'), "not one line: {}", e);
        }
    }

    #[test]
    fn mutated_safetensors_headers_never_panic(edits in proptest::collection::vec((0usize..512, any::<u8>()), 1..4)) {
        let mut bytes = std::fs::read(fixtures().join("tv_small_bottleneck.safetensors")).unwrap();
        for (at, byte) in edits {
            let i = at % bytes.len();
            bytes[i] = byte;
        }
        let _ = load_outcome("tv_small_bottleneck", "crafted.safetensors", &bytes);
    }

    #[test]
    fn the_untouched_safetensors_file_loads(_unused in 0u8..1) {
        let bytes = std::fs::read(fixtures().join("tv_small_bottleneck.safetensors")).unwrap();
        prop_assert_eq!(load_outcome("tv_small_bottleneck", "same.safetensors", &bytes), Ok(()));
    }
}

fn encoded(format: image::ImageFormat) -> Vec<u8> {
    let img = image::RgbImage::from_fn(24, 20, |x, y| image::Rgb([(x * 9) as u8, (y * 11) as u8, ((x + y) * 5) as u8]));
    let mut out = std::io::Cursor::new(Vec::new());
    image::DynamicImage::ImageRgb8(img).write_to(&mut out, format).unwrap();
    out.into_inner()
}

/// Recomputes the CRC of every chunk of a PNG, so a mutation reaches the chunk's parser.
fn fix_png_crcs(png: &mut [u8]) {
    let mut at = 8;
    while at + 12 <= png.len() {
        let len = u32::from_be_bytes(png[at..at + 4].try_into().unwrap()) as usize;
        if at + 12 + len > png.len() {
            break;
        }
        let crc = crc32fast::hash(&png[at + 4..at + 8 + len]);
        png[at + 8 + len..at + 12 + len].copy_from_slice(&crc.to_be_bytes());
        at += 12 + len;
    }
}

#[test]
fn a_jpeg_cut_inside_its_image_data_is_refused() {
    let jpeg = encoded(image::ImageFormat::Jpeg);
    assert!(decode_bytes(jpeg.clone()).is_ok());
    let err = decode_bytes(jpeg[..jpeg.len() * 54 / 100].to_vec()).unwrap_err();
    assert!(err.contains("truncated"), "{err}");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn mutated_images_never_panic(png in any::<bool>(), edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..6), cut in any::<Option<prop::sample::Index>>()) {
        let mut bytes = encoded(if png { image::ImageFormat::Png } else { image::ImageFormat::Jpeg });
        for (at, byte) in &edits {
            let i = at.index(bytes.len());
            bytes[i] = *byte;
        }
        if let Some(cut) = cut {
            bytes.truncate(cut.index(bytes.len()));
        }
        if png {
            fix_png_crcs(&mut bytes);
        }
        prop_assert!(catch_unwind(|| decode_bytes(bytes.clone())).is_ok(), "decoding panicked");
    }
}
