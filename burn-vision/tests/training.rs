//! End-to-end training tests on the bundled real images (CPU, flex backend).

use burn_ddp::params::{flat_values, max_relative_diff};
use burn_flex::Flex;
use burn_vision::train::checkpoint::{best_path, last_path};
use burn_vision::train::inference::predict::restore;
use burn_vision::train::{TrainConfig, run};
use std::path::{Path, PathBuf};

/// These tests run one at a time: the CPU backend splits its parallel reductions adaptively,
/// so trainings running side by side in one process are not bit-for-bit repeatable, and the
/// resume test checks bit-for-bit equality.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn folder_set() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder")
}

/// A quick config over the bundled JPEG class folders (300 images, 10 classes).
fn folder_config(out: &Path, data: &Path) -> TrainConfig {
    TrainConfig {
        data: data.display().to_string(),
        out: out.to_path_buf(),
        image_size: 28,
        batch_size: 16,
        epochs: 2,
        max_steps_per_epoch: Some(4),
        show_progress: false,
        ..TrainConfig::default()
    }
}

#[test]
fn training_on_bundled_fashion_mnist_learns() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        out: dir.path().to_path_buf(),
        epochs: 2,
        batch_size: 32,
        max_steps_per_epoch: Some(40),
        show_progress: false,
        ..TrainConfig::default()
    };
    let summary = run(&config).unwrap();
    let (first, last) = (&summary.epochs[0], &summary.epochs[1]);
    assert!(last.train_loss < first.train_loss, "loss did not fall: {} -> {}", first.train_loss, last.train_loss);
    // 10 balanced classes: chance is 10 %.
    assert!(last.val_acc > 0.5, "validation accuracy {} is not far above chance", last.val_acc);
    assert!(last.val_acc5 >= last.val_acc);
    let lines = std::fs::read_to_string(dir.path().join("metrics.jsonl")).unwrap();
    assert_eq!(lines.lines().count(), 2);
    assert!(best_path(dir.path()).is_file() && last_path(dir.path()).is_file());
}

#[test]
fn resume_continues_exactly() {
    let _serial = serial();
    let data = folder_set();
    let straight = tempfile::tempdir().unwrap();
    run(&folder_config(straight.path(), &data)).unwrap();

    let split = tempfile::tempdir().unwrap();
    let stopped = run(&TrainConfig { stop_after_epochs: Some(1), ..folder_config(split.path(), &data) }).unwrap();
    assert_eq!(stopped.epochs.len(), 1);
    let resumed = run(&TrainConfig { resume: true, ..folder_config(split.path(), &data) }).unwrap();
    assert_eq!(resumed.resumed_after, Some(1));
    assert_eq!(resumed.epochs.len(), 1);

    // Parameter ids are random per process, so compare values, not record bytes.
    let device = Default::default();
    let a = restore::<Flex>(&last_path(straight.path()), &device).unwrap();
    let b = restore::<Flex>(&last_path(split.path()), &device).unwrap();
    assert_eq!((a.meta.epoch, a.meta.step), (b.meta.epoch, b.meta.step));
    let (va, vb) = (flat_values(&a.model), flat_values(&b.model));
    assert!(va.len() > 100_000);
    assert_eq!(va, vb, "parameters differ after resume: max rel diff {}", max_relative_diff(&va, &vb, 1e-6));
    let metrics = std::fs::read_to_string(split.path().join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 2);
    // Both runs name the same held-out files: 20 % of each class of 30.
    let held_out = validation_list(straight.path());
    assert_eq!(held_out, validation_list(split.path()));
    let mut per_class = std::collections::BTreeMap::new();
    for file in &held_out {
        assert!(file.is_file() && file.starts_with(&data), "{} is not a file of the data", file.display());
        *per_class.entry(file.parent().unwrap().to_path_buf()).or_insert(0) += 1;
    }
    assert_eq!(per_class.len(), 10);
    assert!(per_class.values().all(|&n| n == 6), "{per_class:?}");
    assert_eq!(held_out.iter().collect::<std::collections::BTreeSet<_>>().len(), 60);

    // Without --resume an existing run is never overwritten.
    let err = run(&folder_config(split.path(), &data)).unwrap_err().to_string();
    assert!(err.contains("--resume"), "{err}");
    // A resumption with other settings is refused with the setting named.
    let err =
        run(&TrainConfig { resume: true, seed: 9, ..folder_config(split.path(), &data) }).unwrap_err().to_string();
    assert!(err.contains("seed=0") && err.contains("seed=9"), "{err}");
}

/// The files a run's `validation.txt` names.
fn validation_list(run: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string(run.join("validation.txt")).unwrap().lines().map(PathBuf::from).collect()
}

fn copy_tree(from: &Path, to: &Path, per_class: usize) {
    for class in std::fs::read_dir(from).unwrap() {
        let class = class.unwrap().path();
        let dst = to.join(class.file_name().unwrap());
        std::fs::create_dir_all(&dst).unwrap();
        let mut files: Vec<_> = std::fs::read_dir(&class).unwrap().map(|e| e.unwrap().path()).collect();
        files.sort();
        for f in files.into_iter().take(per_class) {
            std::fs::copy(&f, dst.join(f.file_name().unwrap())).unwrap();
        }
    }
}

#[test]
fn corrupt_images_are_skipped_and_counted() {
    let _serial = serial();
    let data = tempfile::tempdir().unwrap();
    copy_tree(&folder_set(), data.path(), 8);
    let bag = data.path().join("Bag");
    std::fs::write(bag.join("zero.jpg"), b"").unwrap();
    std::fs::write(bag.join("garbage.png"), b"this is not a png").unwrap();
    let good = std::fs::read(std::fs::read_dir(&bag).unwrap().next().unwrap().unwrap().path()).unwrap();
    std::fs::write(bag.join("truncated.jpg"), &good[..20]).unwrap();

    let out = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        epochs: 1,
        max_steps_per_epoch: None,
        val_fraction: 0.0,
        ..folder_config(out.path(), data.path())
    };
    let summary = run(&config).unwrap();
    assert_eq!(summary.skipped, 3, "skipped: {:?}", summary.first_skipped);
    assert!(summary.first_skipped.iter().any(|p| p.ends_with("zero.jpg")));
    assert_eq!(summary.epochs[0].skipped_images, 3);

    let strict = tempfile::tempdir().unwrap();
    let err =
        run(&TrainConfig { strict_images: true, ..folder_config(strict.path(), data.path()) }).unwrap_err().to_string();
    assert!(err.contains("Bag/"), "{err}");
}

/// Parameters by path (running statistics included).
fn named_params(model: &burn_vision::model::Classifier<Flex>) -> Vec<(String, Vec<f32>)> {
    use burn_store::ModuleSnapshot;
    model
        .collect(None, None, true)
        .into_iter()
        .map(|s| (s.full_path(), s.to_data().unwrap().to_vec::<f32>().unwrap()))
        .collect()
}

/// Fine-tunes the default model from PyTorch's `resnet10-mini` weights (the fixture
/// `tests/fixtures/weights/tv_resnet10_mini.pth`, torchvision's classes) and compares the trained
/// checkpoint's parameters with the file's: `(path, changed)`.
fn fine_tune(out: &Path, freeze: bool, backbone_lr_scale: f64) -> Vec<(String, bool)> {
    let file = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights/tv_resnet10_mini.pth");
    let config = TrainConfig {
        out: out.to_path_buf(),
        epochs: 1,
        batch_size: 32,
        max_steps_per_epoch: Some(4),
        show_progress: false,
        pretrained: Some(file.clone()),
        freeze_layers: freeze,
        backbone_lr_scale,
        ..TrainConfig::default()
    };
    run(&config).unwrap();
    let trained = restore::<Flex>(&last_path(out), &Default::default()).unwrap();
    assert_eq!(trained.meta.batches_tracked, Some(1234 + 4), "num_batches_tracked = the file's + the steps");
    let fresh = burn_vision::model::create::<Flex>("resnet10-mini", 10, 1, true, &Default::default()).unwrap();
    let (loaded, _) = burn_vision::weights::load_pretrained(fresh, "resnet10-mini", &file).unwrap();
    named_params(&trained.model)
        .into_iter()
        .zip(named_params(&loaded))
        .map(|((path, a), (_, b))| (path, a != b))
        .collect()
}

#[test]
fn pretrained_weights_with_frozen_layers_train_only_the_head() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    for (path, changed) in fine_tune(dir.path(), true, 1.0) {
        // BatchNorm running statistics follow the data in train mode, frozen or not (PyTorch too).
        let expected = path.starts_with("fc.") || path.contains("running_");
        assert_eq!(changed, expected, "{path}: changed={changed}");
    }
}

#[test]
fn a_zero_backbone_learning_rate_moves_only_the_head() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let changes = fine_tune(dir.path(), false, 0.0);
    for (path, changed) in &changes {
        assert_eq!(*changed, path.starts_with("fc.") || path.contains("running_"), "{path}: changed={changed}");
    }
    // And at the full rate the backbone moves.
    let dir = tempfile::tempdir().unwrap();
    assert!(
        fine_tune(dir.path(), false, 1.0)
            .iter()
            .any(|(p, changed)| p.starts_with("layer1.") && !p.contains("running_") && *changed)
    );
}

#[test]
fn vit_mini_learns_on_bundled_data() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let config = TrainConfig {
        model: "vit-mini".into(),
        out: dir.path().to_path_buf(),
        epochs: 1,
        batch_size: 32,
        max_steps_per_epoch: Some(60),
        show_progress: false,
        ..TrainConfig::default()
    };
    let summary = run(&config).unwrap();
    let acc = summary.epochs[0].val_acc;
    // 10 balanced classes: chance is 10 %.
    assert!(acc > 0.2, "ViT validation accuracy {acc} is not clearly above chance");
    // The checkpoint restores as a ViT and predicts.
    let restored = restore::<Flex>(&best_path(dir.path()), &Default::default()).unwrap();
    assert_eq!(restored.meta.model, "vit-mini");
}

/// One process is DDP's world of one: the same run through a one-rank DDP group (rank 0's
/// broadcast at the start, the averaged gradients, the epoch-end buffer broadcast) trains
/// bit-for-bit like the run without it — the same initial weights and the same data order.
#[test]
fn one_rank_ddp_trains_exactly_like_one_process() {
    let _serial = serial();
    let data = folder_set();
    let (plain_dir, ddp_dir) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let plain = run(&folder_config(plain_dir.path(), &data)).unwrap();
    let dist = burn_vision::train::distributed::Distributed::alone(None, burn_ddp::DdpConfig::default()).unwrap();
    let ddp = burn_vision::train::train_with::<burn_autodiff::Autodiff<Flex>>(
        &folder_config(ddp_dir.path(), &data),
        Default::default(),
        Some(&dist),
    )
    .unwrap();
    assert!(dist.ddp.stats().steps > 0, "the gradients went through DDP");
    let device = Default::default();
    let (a, b) = (
        restore::<Flex>(&last_path(plain_dir.path()), &device).unwrap(),
        restore::<Flex>(&last_path(ddp_dir.path()), &device).unwrap(),
    );
    let (va, vb) = (flat_values(&a.model), flat_values(&b.model));
    assert_eq!(va, vb, "parameters differ: max rel diff {}", max_relative_diff(&va, &vb, 1e-6));
    for (p, d) in plain.epochs.iter().zip(&ddp.epochs) {
        assert_eq!((p.train_loss, p.val_loss, p.val_acc), (d.train_loss, d.val_loss, d.val_acc), "epoch {}", p.epoch);
    }
}
