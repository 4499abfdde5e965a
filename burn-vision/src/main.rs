//! The `burn-vision` command: `train`, `eval`, `predict`, `bench`, `bench-data`, `export`,
//! `plot`, `models`. Thin: the flags are the library's settings (`burn_vision::cli`), and the
//! library does the work.

use anyhow::Result;
use burn_vision::cli::{BenchArgs, BenchDataArgs, TrainArgs, launch_ranks};
use burn_vision::data::source::load_source_with;
use burn_vision::model::registry::list_models;
use burn_vision::train::bench::data::bench_data;
use burn_vision::train::config::DeviceSpec;
use burn_vision::train::inference::predict::restore;
use burn_vision::train::inference::requests::{EvalRequest, evaluate_checkpoint, predict_paths};
use burn_vision::train::{run, run_bench};
use burn_vision::weights::{WeightFormat, export, scheme_index};
use clap::{Args, Parser, Subcommand};
use std::path::PathBuf;

#[derive(Parser)]
#[command(name = "burn-vision", version, about = "Train, evaluate and run image classifiers on Burn")]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
// Parsed once per process: the size of the largest variant does not matter.
#[allow(clippy::large_enum_variant)]
enum Command {
    /// Train a model (with no flags: ResNet-10-mini on the bundled Fashion-MNIST subset, CPU).
    #[command(allow_negative_numbers = true)]
    Train(TrainArgs),
    /// Evaluate a checkpoint on the validation split of its data (or all of --data).
    Eval(EvalRequest),
    /// Print the top classes of each image.
    Predict(PredictArgs),
    /// Measure training throughput on synthetic data (prints one JSON line).
    #[command(allow_negative_numbers = true)]
    Bench(BenchArgs),
    /// Measure how fast the input pipeline alone delivers batches (prints one JSON line).
    BenchData(BenchDataArgs),
    /// Write a checkpoint's model as PyTorch weights (torchvision / timm names), for
    /// `model.load_state_dict(..., strict=True)`.
    Export(ExportArgs),
    /// Draw the training curves of one or several runs (loss, accuracy, learning rate, img/s
    /// per epoch, from each run's metrics.jsonl) into a PNG.
    Plot(PlotArgs),
    /// List the models in the registry.
    Models,
}

#[derive(Args)]
struct PlotArgs {
    /// Run folders (--out of `train`), overlaid in one figure, e.g. runs/1gpu runs/2gpu.
    #[arg(required = true)]
    runs: Vec<PathBuf>,
    /// The PNG to write.
    #[arg(short, long, default_value = "curves.png")]
    output: PathBuf,
}

#[derive(Args)]
struct ExportArgs {
    /// A checkpoint written by `train` (best.ckpt or last.ckpt).
    #[arg(long)]
    checkpoint: PathBuf,
    /// `safetensors` or `pth` (torch.save's format); default: from --output's extension, else pth.
    #[arg(long)]
    format: Option<String>,
    /// The file to write (default: the checkpoint's path with .pth or .safetensors).
    #[arg(long)]
    output: Option<PathBuf>,
    /// Whose parameter names to write: `timm` or `torchvision` for ViTs (default: timm);
    /// ResNets have one set (torchvision's, which timm shares).
    #[arg(long)]
    names: Option<String>,
}

#[derive(Args)]
struct PredictArgs {
    /// A checkpoint written by `train` (best.ckpt or last.ckpt).
    #[arg(long)]
    checkpoint: PathBuf,
    /// How many classes to show per image.
    #[arg(long, default_value_t = 3)]
    top: usize,
    /// GPU to predict on (default: as for eval).
    #[arg(long = "gpus", value_name = "ID", value_parser = DeviceSpec::parse_one_gpu)]
    gpu: Option<usize>,
    /// Image files and folders of images (.jpg, .jpeg, .png); an unreadable image is reported
    /// and the others go on.
    #[arg(required = true)]
    images: Vec<PathBuf>,
}

fn cmd_train(a: TrainArgs) -> Result<()> {
    let TrainArgs { config, max_restarts } = a;
    // Under a launcher (ours, torchrun, srun, mpirun) this process is one rank of its world.
    let place = burn_ddp::launch_env::detect(&|k| std::env::var(k).ok())?;
    // Several ranks, or restarts asked for: this process becomes their launcher.
    if (config.processes() > 1 || max_restarts > 0) && place.is_none() {
        let code = launch_ranks(&config, max_restarts)?;
        if code != 0 {
            std::process::exit(code);
        }
        return Ok(());
    }
    if max_restarts > 0 && place.as_ref().is_some_and(|p| p.rank == 0) {
        log::warn!(
            "--max-restarts is for the ranks train starts itself; under an outside launcher give it to the launcher (train continues from last.ckpt when restarted)"
        );
    }
    let summary = run(&config)?;
    if place.is_some_and(|p| p.rank != 0) {
        return Ok(());
    }
    if summary.skipped > 0 {
        log::warn!("skipped {} unreadable image(s); first: {}", summary.skipped, summary.first_skipped.join(", "));
    }
    let last = summary.epochs.last();
    println!(
        "done: {} epoch(s) in {:.1}s, final val acc {:.2}%, best {:.2}%, skipped images {}, checkpoints and metrics.jsonl in {}",
        summary.epochs.len(),
        summary.seconds,
        100.0 * last.map_or(0.0, |r| r.val_acc),
        100.0 * summary.best_acc,
        summary.skipped,
        summary.out.display()
    );
    Ok(())
}

fn cmd_eval(request: EvalRequest) -> Result<()> {
    let r = evaluate_checkpoint(&request)?;
    println!(
        "{}: {} images ({} skipped) on {}: loss {:.4}, top-1 {:.2}%, top-5 {:.2}%",
        request.checkpoint.display(),
        r.images,
        r.skipped,
        r.device,
        r.tally.loss(),
        100.0 * r.tally.acc1(),
        100.0 * r.tally.acc5()
    );
    Ok(())
}

fn cmd_predict(a: PredictArgs) -> Result<()> {
    let results = predict_paths(&a.checkpoint, &a.images, a.top, a.gpu)?;
    anyhow::ensure!(
        !results.is_empty(),
        "no .jpg/.jpeg/.png images in {}",
        a.images.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(", ")
    );
    let mut failed = 0;
    for (path, result) in &results {
        match result {
            Ok(p) => {
                let top: Vec<String> = p.top.iter().map(|(c, prob)| format!("{c} {:.1}%", 100.0 * prob)).collect();
                println!("{}: {}", p.path, top.join(", "));
            }
            Err(e) => {
                failed += 1;
                eprintln!("{}: not predicted: {e}", path.display());
            }
        }
    }
    anyhow::ensure!(failed < results.len(), "none of the {} image(s) could be read", results.len());
    if failed > 0 {
        eprintln!("{failed} of {} image(s) could not be read (listed above)", results.len());
    }
    Ok(())
}

fn cmd_bench(a: BenchArgs) -> Result<()> {
    let config = a.into_config();
    let spec = config.gpu.map_or(DeviceSpec::Cpu, |g| DeviceSpec::Cuda(vec![g]));
    let result = run_bench(&config, &spec)?;
    println!("{}", serde_json::to_string(&result)?);
    Ok(())
}

fn cmd_bench_data(a: BenchDataArgs) -> Result<()> {
    let augment = a.augment.0;
    augment.validate()?;
    let data = load_source_with(&a.data.parse().expect("infallible"), a.image_size, &augment)?;
    println!("{}", serde_json::to_string(&bench_data(&data, &a.config, a.gpu)?)?);
    Ok(())
}

fn cmd_export(a: ExportArgs) -> Result<()> {
    let format = match (&a.format, &a.output) {
        (Some(f), _) => f.parse()?,
        (None, Some(out)) => WeightFormat::for_path(out),
        (None, None) => WeightFormat::Pth,
    };
    let output = a.output.unwrap_or_else(|| {
        a.checkpoint.with_extension(if format == WeightFormat::Safetensors { "safetensors" } else { "pth" })
    });
    let restored = restore::<burn_flex::Flex>(&a.checkpoint, &Default::default())?;
    let tracked = restored.meta.batches_tracked.unwrap_or(restored.meta.step as i64);
    let scheme = scheme_index(&restored.model, a.names.as_deref())?;
    let n = export(&restored.model, &output, format, (tracked, scheme))?;
    println!(
        "{}: {} tensors of {} ({} classes) written as {format:?}, num_batches_tracked {tracked}",
        output.display(),
        n,
        restored.meta.model,
        restored.meta.classes.len()
    );
    Ok(())
}

fn main() {
    // SAFETY: the first statement of `main`: no other thread exists yet.
    unsafe { burn_ddp::device::use_all_cuda_queues() };
    burn_vision::mark_start();
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("info"))
        .format_timestamp(None)
        .format_target(false)
        .init();
    let cli = Cli::try_parse().unwrap_or_else(|e| usage_error(&e));
    let command = cli.command.or_else(|| Cli::parse_from(["burn-vision", "train"]).command).expect("train parses");
    let result = match command {
        Command::Train(a) => cmd_train(a),
        Command::Eval(a) => cmd_eval(a),
        Command::Predict(a) => cmd_predict(a),
        Command::Bench(a) => cmd_bench(a),
        Command::BenchData(a) => cmd_bench_data(a),
        Command::Export(a) => cmd_export(a),
        Command::Plot(a) => burn_vision::plot::plot_folders(&a.runs, &a.output)
            .map(|()| println!("wrote {} ({} run(s))", a.output.display(), a.runs.len()))
            .map_err(Into::into),
        Command::Models => {
            println!("{}", list_models().join("\n"));
            Ok(())
        }
    };
    if let Err(e) = result {
        eprintln!("error: {}", one_line(&e));
        std::process::exit(1);
    }
}

/// A flag clap or one of our parsers refused: one line (our parsers' messages already name the
/// flag and say what to give), exit status 2 as for any usage error; help and version as clap
/// prints them.
fn usage_error(e: &clap::Error) -> ! {
    use clap::error::ErrorKind;
    if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) || !e.use_stderr() {
        e.exit();
    }
    let line = match std::error::Error::source(e) {
        Some(ours) if e.kind() == ErrorKind::ValueValidation => ours.to_string(),
        // clap's first paragraph, its lines joined (the flags it names sit on the next lines).
        _ => {
            let text = e.to_string();
            let first: Vec<&str> = text.lines().take_while(|l| !l.trim().is_empty()).map(str::trim).collect();
            first.join(" ").trim_start_matches("error: ").to_string()
        }
    };
    eprintln!("error: {line} (see --help)");
    std::process::exit(2);
}

/// The error and its causes on one line, each said once: burn-vision's errors already end with
/// their source's text, which `{:#}` would repeat.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = e.to_string();
    for cause in e.chain().skip(1).map(ToString::to_string) {
        if !line.contains(&cause) {
            line = format!("{line}: {cause}");
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::one_line;

    #[test]
    fn a_cause_the_message_already_holds_is_not_repeated() {
        let io = std::io::Error::from_raw_os_error(13);
        let ours = burn_vision::error::Error::io("creating", std::path::Path::new("/run"), io);
        let text = one_line(&anyhow::Error::from(ours));
        assert_eq!(text.matches("os error 13").count(), 1, "{text}");
        let wrapped = anyhow::Error::from(std::io::Error::from_raw_os_error(2)).context("reading the list");
        assert!(
            one_line(&wrapped).starts_with("reading the list: ") && one_line(&wrapped).contains("os error 2"),
            "{}",
            one_line(&wrapped)
        );
    }
}
