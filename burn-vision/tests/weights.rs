//! PyTorch weights in and out against PyTorch's own numbers: the fixtures in
//! `tests/fixtures/weights` were written by `benches/weights/make_weights.py fixtures` on the
//! GPU machine (torch 2.11, torchvision 0.26, timm 1.0) — small torchvision/timm ResNets with
//! the real models' key names, saved plain, as the tutorial's DDP checkpoint
//! (`{"state_dict": {"module.…"}}`), as timm's `{"model": …}` and as safetensors — with their
//! float64 eval-mode logits.

use burn_flex::Flex;
use burn_vision::model::Classifier;
use burn_vision::weights::golden::{Golden, arch_config, logits_error};
use burn_vision::weights::{WeightFormat, export, load_pretrained};
use std::path::{Path, PathBuf};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/weights")
}

fn fresh(arch: &str, classes: usize) -> Classifier<Flex> {
    let channels = if arch == "resnet10-mini" { 1 } else { 3 };
    arch_config(arch, classes, channels).unwrap().init(&Default::default())
}

fn params(model: &Classifier<Flex>) -> Vec<(String, Vec<f32>)> {
    use burn_store::ModuleSnapshot;
    model
        .collect(None, None, true)
        .into_iter()
        .map(|s| (s.full_path(), s.to_data().unwrap().to_vec::<f32>().unwrap()))
        .collect()
}

#[test]
fn every_fixture_loads_and_matches_pytorchs_logits() {
    let golden = Golden::load(&fixtures()).unwrap();
    assert_eq!(golden.models.len(), 8);
    for (name, g) in &golden.models {
        let untouched = logits_error(&fresh(&g.arch, g.classes), g, &Default::default());
        let (model, report) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &fixtures().join(&g.file)).unwrap();
        let err = logits_error(&model, g, &Default::default());
        println!("{name}: {report}; max |Δ|/max|logit| = {err:.2e} (before loading {untouched:.2e})");
        assert!(err <= 1e-4, "{name}: logits differ from PyTorch's by {err:.3e} of their scale");
        assert!(untouched > 1e-2, "{name}: a fresh model already matched ({untouched}), the test proves nothing");
        // BatchNorm's num_batches_tracked (the ViTs have none).
        let expected_tracked = (!g.arch.contains("vit")).then_some(1234);
        assert_eq!(report.batches_tracked, expected_tracked, "{name}");
        assert_eq!(report.head_reinitialised, None);
    }
}

#[test]
fn wrappers_and_ddp_prefixes_are_found() {
    let golden = Golden::load(&fixtures()).unwrap();
    let stripped = |name: &str| {
        let g = &golden.models[name];
        load_pretrained(fresh(&g.arch, g.classes), &g.arch, &fixtures().join(&g.file)).unwrap().1.stripped
    };
    assert_eq!(stripped("tv_small_basic"), "");
    assert_eq!(stripped("tv_small_bottleneck_ddp"), "state_dict.module.");
    assert_eq!(stripped("timm_small_basic"), "model.");
    assert_eq!(stripped("tv_small_bottleneck_st"), "");
}

#[test]
fn vit_weights_load_under_timm_or_torchvision_names_and_export_back() {
    let golden = Golden::load(&fixtures()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (name, names) in [("timm_small_vit", "timm"), ("tv_small_vit", "torchvision")] {
        let g = &golden.models[name];
        let (model, report) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &fixtures().join(&g.file)).unwrap();
        assert_eq!(report.names, names, "{name}");
        let scheme = burn_vision::weights::scheme_index(&model, Some(names)).unwrap();
        let path = dir.path().join(format!("{name}.safetensors"));
        export(&model, &path, WeightFormat::Safetensors, (0, scheme)).unwrap();
        // Our file carries the same names as PyTorch's.
        let mut ours = burn_store::SafetensorsStore::from_file(&path);
        let mut theirs_keys = if g.file.ends_with(".pth") {
            burn_store::ModuleStore::keys(&mut burn_store::PytorchStore::from_file(fixtures().join(&g.file))).unwrap()
        } else {
            burn_store::ModuleStore::keys(&mut burn_store::SafetensorsStore::from_file(fixtures().join(&g.file)))
                .unwrap()
        };
        let mut our_keys = burn_store::ModuleStore::keys(&mut ours).unwrap();
        our_keys.sort();
        theirs_keys.sort();
        assert_eq!(our_keys, theirs_keys, "{name}");
        let (back, _) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &path).unwrap();
        assert_eq!(params(&back), params(&model), "{name}");
    }
}

#[test]
fn export_then_import_gives_identical_parameters_in_both_formats() {
    let golden = Golden::load(&fixtures()).unwrap();
    let g = &golden.models["tv_small_bottleneck_ddp"];
    let (model, _) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &fixtures().join(&g.file)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (file, format) in [("out.pth", WeightFormat::Pth), ("out.safetensors", WeightFormat::Safetensors)] {
        let path = dir.path().join(file);
        let written = export(&model, &path, format, (4321, 0)).unwrap();
        // 5 tensors per BatchNorm with num_batches_tracked, as PyTorch's state dict.
        assert_eq!(written, golden_key_count(), "{file}");
        let (back, report) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &path).unwrap();
        assert_eq!(params(&back), params(&model), "{file}: parameters changed on the way out and back");
        assert_eq!(report.batches_tracked, Some(4321), "{file}");
        let entries: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(entries.iter().all(|n| !n.to_string_lossy().ends_with(".tmp")), "temporary files left: {entries:?}");
    }
}

/// The number of keys in the DDP fixture's state dict (PyTorch's count for that model).
fn golden_key_count() -> usize {
    let mut store = burn_store::PytorchStore::from_file(fixtures().join("tv_small_bottleneck_ddp.pth"))
        .with_top_level_key("state_dict");
    burn_store::ModuleStore::keys(&mut store).unwrap().len()
}

#[test]
fn another_class_count_reinitialises_only_the_head() {
    let golden = Golden::load(&fixtures()).unwrap();
    let g = &golden.models["tv_small_basic"];
    let (model, report) = load_pretrained(fresh(&g.arch, 5), &g.arch, &fixtures().join(&g.file)).unwrap();
    assert_eq!(report.head_reinitialised, Some((10, 5)));
    assert!(report.to_string().contains("re-initialised"), "{report}");
    let (full, _) = load_pretrained(fresh(&g.arch, 10), &g.arch, &fixtures().join(&g.file)).unwrap();
    let (a, b) = (params(&model), params(&full));
    for ((path, x), (_, y)) in a.iter().zip(&b) {
        if !path.starts_with("fc.") {
            assert_eq!(x, y, "{path} was not loaded");
        }
    }
}

fn one_line_error(model: Classifier<Flex>, arch: &str, path: &Path) -> String {
    let msg = load_pretrained(model, arch, path).map(|_| ()).unwrap_err().to_string();
    assert!(!msg.contains('\n'), "not one line: {msg}");
    msg
}

#[test]
fn bad_files_get_one_line_errors() {
    let golden = Golden::load(&fixtures()).unwrap();
    let g = &golden.models["tv_small_basic"];
    let dir = tempfile::tempdir().unwrap();
    let missing = one_line_error(fresh(&g.arch, 10), &g.arch, &dir.path().join("nope.pth"));
    assert!(missing.contains("nope.pth") && missing.contains("cannot read"), "{missing}");

    let bytes = std::fs::read(fixtures().join(&g.file)).unwrap();
    let truncated = dir.path().join("truncated.pth");
    std::fs::write(&truncated, &bytes[..bytes.len() / 2]).unwrap();
    let msg = one_line_error(fresh(&g.arch, 10), &g.arch, &truncated);
    assert!(msg.contains("truncated.pth") && msg.contains("not a readable"), "{msg}");

    let garbage = dir.path().join("garbage.safetensors");
    std::fs::write(&garbage, b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}").unwrap();
    let msg = one_line_error(fresh(&g.arch, 10), &g.arch, &garbage);
    assert!(msg.contains("garbage.safetensors"), "{msg}");

    // A BasicBlock file into a Bottleneck model: every difference counted, a few named.
    let msg = one_line_error(fresh("tv_small_bottleneck", 10), "resnet-bottleneck", &fixtures().join(&g.file));
    assert!(msg.contains("missing (") && msg.contains("wrongly shaped (") && msg.contains("more"), "{msg}");
    assert!(msg.contains("layer1.0.bn3.weight"), "{msg}");
}

#[test]
fn half_precision_files_load_as_f32() {
    use burn::tensor::DType;
    use burn_store::ModuleStore;
    let golden = Golden::load(&fixtures()).unwrap();
    let g = &golden.models["tv_small_bottleneck_st"];
    // The fixture's tensors rewritten in f16 (as `model.half().state_dict()` would be saved).
    let mut store = burn_store::SafetensorsStore::from_file(fixtures().join(&g.file));
    let halves: Vec<(String, Vec<u8>, Vec<usize>, safetensors::Dtype)> = store
        .get_all_snapshots()
        .unwrap()
        .iter()
        .map(|(name, s)| {
            let data = s.to_data().unwrap();
            let (data, dtype) = if data.dtype == DType::F32 {
                (data.convert_dtype(DType::F16), safetensors::Dtype::F16)
            } else {
                (data, safetensors::Dtype::I64)
            };
            (name.clone(), data.as_bytes().to_vec(), s.shape.to_vec(), dtype)
        })
        .collect();
    let views: Vec<_> = halves
        .iter()
        .map(|(n, b, shape, dtype)| {
            (n.clone(), safetensors::tensor::TensorView::new(*dtype, shape.clone(), b).unwrap())
        })
        .collect();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("half.safetensors");
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
    let (model, report) = load_pretrained(fresh(&g.arch, g.classes), &g.arch, &path).unwrap();
    assert_eq!(report.converted_from, vec!["f16".to_string()]);
    let err = logits_error(&model, g, &Default::default());
    assert!(err < 5e-3, "f16 weights: logits off by {err:.2e} of their scale");
}
