//! The weight import/export proof on full-size models: for every model of `DIR/golden.json`
//! (written by `benches/weights/make_weights.py`), load its PyTorch file, compare our eval-mode
//! logits with PyTorch's float64 ones on the CPU (and with `--gpu` on GPU 0, NCHW and
//! channels-last), and with `--export OUT` write it back as `.pth` and `.safetensors` for
//! `make_weights.py check`. Exits 1 when an error exceeds 1e-4 of the logits' scale.
//!
//! `cargo run --release -p burn-vision --example weights_check [--features cuda] -- DIR [--gpu] [--export OUT]`

use burn::prelude::*;
use burn_vision::model::Classifier;
use burn_vision::weights::golden::{Golden, GoldenModel, arch_config, logits_error};
use burn_vision::weights::{WeightFormat, export, load_pretrained, scheme_index};
use std::path::{Path, PathBuf};
use std::time::Instant;

/// The model of `g` with its weights, and the index of the naming scheme the file used.
fn load<B: Backend>(dir: &Path, g: &GoldenModel, device: &B::Device) -> burn_vision::Result<(Classifier<B>, usize)> {
    let model = arch_config(&g.arch, g.classes, g.input_shape[1])?.init::<B>(device);
    let (model, report) = load_pretrained(model, &g.arch, &dir.join(&g.file))?;
    println!("  {}: {report}", g.file);
    let scheme = scheme_index(&model, Some(report.names))?;
    Ok((model, scheme))
}

fn row(name: &str, device: &str, err: f64, seconds: f64) -> bool {
    let ok = err <= 1e-4;
    println!("| {name} | {device} | {err:.2e} | {seconds:.1} s | {} |", if ok { "ok" } else { "FAIL" });
    ok
}

#[cfg(feature = "cuda")]
fn gpu_rows(dir: &Path, name: &str, g: &GoldenModel) -> burn_vision::Result<bool> {
    type Gpu = burn_cuda::Cuda;
    let device = burn_cuda::CudaDevice::new(0);
    let mut ok = true;
    for channels_last in [false, true] {
        let t = Instant::now();
        let model =
            burn_vision::model::ImageClassifier::with_channels_last(load::<Gpu>(dir, g, &device)?.0, channels_last);
        let err = logits_error(&model, g, &device);
        ok &= row(name, if channels_last { "GPU, channels-last" } else { "GPU, NCHW" }, err, t.elapsed().as_secs_f64());
    }
    Ok(ok)
}

#[cfg(not(feature = "cuda"))]
fn gpu_rows(_: &Path, _: &str, _: &GoldenModel) -> burn_vision::Result<bool> {
    eprintln!("--gpu needs a build with --features cuda");
    Ok(false)
}

fn main() -> burn_vision::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let dir = PathBuf::from(args.first().expect("usage: weights_check DIR [--gpu] [--export OUT]"));
    let gpu = args.iter().any(|a| a == "--gpu");
    let export_to = args.iter().position(|a| a == "--export").and_then(|i| args.get(i + 1)).map(PathBuf::from);
    let golden = Golden::load(&dir)?;
    let mut ok = true;
    println!("| model | device | max abs error / max abs logit | load + forward | |\n|---|---|---|---|---|");
    for (name, g) in &golden.models {
        let t = Instant::now();
        let device = Default::default();
        let (model, scheme) = load::<burn_flex::Flex>(&dir, g, &device)?;
        ok &= row(name, "CPU", logits_error(&model, g, &device), t.elapsed().as_secs_f64());
        if gpu {
            ok &= gpu_rows(&dir, name, g)?;
        }
        if let Some(out) = &export_to {
            for (ext, format) in [("pth", WeightFormat::Pth), ("safetensors", WeightFormat::Safetensors)] {
                let path = out.join(format!("{name}.{ext}"));
                let n = export(&model, &path, format, (1234, scheme))?;
                println!("  exported {} ({n} tensors)", path.display());
            }
        }
    }
    if !ok {
        std::process::exit(1);
    }
    Ok(())
}
