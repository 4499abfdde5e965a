//! The command line: bad input gets one actionable line; eval and predict read checkpoints.

use std::path::Path;
use std::process::{Command, Output};

fn cli(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_burn-vision")).args(args).env("RUST_LOG", "warn").output().unwrap()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_input_gets_one_clear_line() {
    let cases: [(&[&str], &str); 33] = [
        (&["train", "--lr", "-1", "--quiet"], "must be a positive number"),
        (&["train", "--strategy", "ring", "--quiet"], "use ddp"),
        (&["train", "--strategy", "dp", "--sync-bn", "--nproc", "2", "--quiet"], "--sync-bn"),
        (&["train", "--data", "/no/such/folder", "--quiet"], "does not exist"),
        (&["train", "--model", "vgg16", "--quiet"], "available: resnet10-mini"),
        (&["train", "--gpus", "0,x"], "`x` is not a GPU number"),
        (&["train", "--batch-size", "0"], "--batch-size"),
        (&["train", "--precision", "int8", "--quiet"], "use f32, bf16 or f16"),
        (&["predict", "--checkpoint", "/no/such.ckpt", "x.png"], "file not found"),
        (&["bench-data", "--data", "/no/such/folder"], "does not exist"),
        (&["train", "--data", "/no/such/shard-{000..003}.tar", "--quiet"], "shard-000.tar: does not exist"),
        (&["bench-data", "--data", "/no/such/s-{5..1}.tar"], "the range `{5..1}` is empty"),
        (&["bench-data", "--batches", "1000"], "lower --batches or --batch-size"),
        (&["train", "--pretrained", "/no/such.pth", "--quiet"], "cannot read it"),
        (&["train", "--freeze-layers", "--backbone-lr-scale", "0.1", "--quiet"], "drop one of them"),
        (&["export", "--checkpoint", "/no/such.ckpt"], "file not found"),
        (&["train", "--clip-grad-norm", "0", "--quiet"], "--clip-grad-norm"),
        (&["train", "--checkpoint-every", "0", "--quiet"], "--checkpoint-every"),
        (&["train", "--profile-steps", "5..5", "--quiet"], "write A..B"),
        (&["train", "--timeout-s", "0", "--quiet"], "--timeout-s"),
        (&["plot", "/no/such/run"], "metrics.jsonl"),
        (&["train", "--hflip", "2", "--quiet"], "--hflip"),
        (&["train", "--preset", "deit", "--quiet"], "available: tutorial, vit"),
        (&["train", "--rrc-scale", "0.5", "--quiet"], "MIN,MAX"),
        (&["train", "--randaugment", "two", "--quiet"], "give N,M"),
        (&["train", "--sync-bn", "--no-sync-bn"], "cannot be used with"),
        (&["eval", "--checkpoint", "x.ckpt", "--gpus", "0,1"], "this command runs on one GPU"),
        (&["bench", "--no-overlap"], "--ddp"),
        (&["bench", "--ddp-interleave", "4"], "--ddp"),
        (&["bench", "--ddp", "--ddp-interleave", "0", "--model", "resnet10-mini"], "at least one step"),
        (&["bench", "--bucket-cap-mb", "5"], "--ddp"),
        (&["bench", "--ddp", "--bucket-cap-mb", "0"], "--bucket-cap-mb"),
        (&["train", "--bucket-cap-mb", "x", "--quiet"], "--bucket-cap-mb"),
    ];
    for (args, expected) in cases {
        let out = cli(args);
        // 2: refused while reading the flags (a usage error, as clap and argparse say it); 1:
        // refused by the run's checks or on the way.
        assert!(matches!(out.status.code(), Some(1 | 2)), "{args:?}: {:?}", out.status);
        let err = stderr(&out);
        assert!(err.contains(expected), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?} printed more than one line: {err}");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn gpus_without_cuda_build_says_how_to_get_it() {
    for gpus in ["0", "0,1"] {
        let err = stderr(&cli(&["train", "--gpus", gpus]));
        assert!(err.contains("--no-default-features"), "--gpus {gpus}: {err}");
    }
}

#[test]
fn train_then_eval_and_predict() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    let data = data.to_str().unwrap();
    let o = cli(&[
        "train",
        "--data",
        data,
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("done: 1 epoch(s)"));

    let ckpt = out.join("best.ckpt");
    let o = cli(&["eval", "--checkpoint", ckpt.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert!(text.contains("60 images") && text.contains("top-1"), "{text}");

    let image = Path::new(data).join("Bag").read_dir().unwrap().next().unwrap().unwrap().path();
    let o = cli(&["predict", "--checkpoint", ckpt.to_str().unwrap(), "--top", "2", image.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let text = String::from_utf8_lossy(&o.stdout);
    assert_eq!(text.lines().count(), 1);
    assert_eq!(text.matches('%').count(), 2, "{text}");

    // A folder and a broken file: every readable image predicted, the broken one reported.
    let mixed = dir.path().join("mixed");
    std::fs::create_dir(&mixed).unwrap();
    for (i, f) in Path::new(data).join("Bag").read_dir().unwrap().take(3).enumerate() {
        std::fs::copy(f.unwrap().path(), mixed.join(format!("{i}.jpg"))).unwrap();
    }
    std::fs::write(mixed.join("broken.jpg"), b"not a jpeg").unwrap();
    let o = cli(&["predict", "--checkpoint", ckpt.to_str().unwrap(), mixed.to_str().unwrap(), image.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 4, "3 from the folder and the file");
    let err = stderr(&o);
    assert!(err.contains("broken.jpg: not predicted") && err.contains("1 of 5 image(s) could not be read"), "{err}");

    // Export as PyTorch weights, and fine-tune from the export: the names round-trip.
    let o = cli(&["export", "--checkpoint", ckpt.to_str().unwrap(), "--format", "safetensors"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let exported = out.join("best.safetensors");
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("tensors of resnet10-mini"),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = cli(&["export", "--checkpoint", ckpt.to_str().unwrap(), "--names", "timm"]);
    assert!(stderr(&o).contains("this model's PyTorch names are torchvision"), "{}", stderr(&o));
    let tuned = dir.path().join("tuned");
    let args = [
        "train",
        "--data",
        data,
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--max-steps-per-epoch",
        "1",
        "--batch-size",
        "16",
        "--quiet",
    ];
    let o = Command::new(env!("CARGO_BIN_EXE_burn-vision"))
        .args(args)
        .args(["--pretrained", exported.to_str().unwrap(), "--out", tuned.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("pretrained weights") && stderr(&o).contains("tensors loaded"), "{}", stderr(&o));

    let corrupt = dir.path().join("bad.ckpt");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&corrupt, bytes).unwrap();
    let err = stderr(&cli(&["eval", "--checkpoint", corrupt.to_str().unwrap()]));
    assert!(err.contains("truncated or corrupt"), "{err}");
}

/// One epoch on the bundled JPEG folder at 28 px, batch 8 per device, into `out`, with the
/// device flags `how`; asserts success and returns (stdout, stderr).
fn train_two_on_the_jpeg_folder(out: &Path, how: &[&str]) -> (String, String) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    train_one_epoch_on(&data.display().to_string(), out, how)
}

/// One epoch on `data` at 28 px, batch 8 per device, into `out`, with the device flags `how`;
/// asserts success and returns (stdout, stderr).
fn train_one_epoch_on(data: &str, out: &Path, how: &[&str]) -> (String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_burn-vision"))
        .arg("train")
        .args(how)
        .args([
            "--data",
            data,
            "--image-size",
            "28",
            "--epochs",
            "1",
            "--batch-size",
            "8",
            "--quiet",
            "--out",
            out.to_str().unwrap(),
        ])
        .output()
        .unwrap();
    let (stdout, stderr) =
        (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned());
    assert!(o.status.success(), "{stdout}\n{stderr}");
    (stdout, stderr)
}

/// The bundled JPEG folder as WebDataset shards of the given sizes (classes interleaved, as
/// `cargo xtask data shards` mixes them), with classes.txt; returns the brace range naming them.
fn folder_as_shards(out: &Path, sizes: &[usize]) -> String {
    let folder = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    let mut classes: Vec<_> = std::fs::read_dir(&folder).unwrap().map(|e| e.unwrap().path()).collect();
    classes.sort();
    let files: Vec<Vec<_>> = classes
        .iter()
        .map(|c| {
            let mut f: Vec<_> = std::fs::read_dir(c).unwrap().map(|e| e.unwrap().path()).collect();
            f.sort();
            f
        })
        .collect();
    let per_class = files[0].len();
    let interleaved: Vec<(usize, &std::path::PathBuf)> =
        (0..per_class).flat_map(|i| files.iter().enumerate().map(move |(label, f)| (label, &f[i]))).collect();
    assert_eq!(interleaved.len(), sizes.iter().sum::<usize>());
    std::fs::create_dir_all(out).unwrap();
    let names: Vec<String> = classes.iter().map(|c| c.file_name().unwrap().to_string_lossy().into_owned()).collect();
    std::fs::write(out.join("classes.txt"), names.join("\n")).unwrap();
    let mut next = interleaved.iter().enumerate();
    for (shard, &size) in sizes.iter().enumerate() {
        let mut tar = tar::Builder::new(std::fs::File::create(out.join(format!("s-{shard}.tar"))).unwrap());
        for (key, (label, path)) in next.by_ref().take(size) {
            for (name, bytes) in [
                (format!("{key:06}.jpg"), std::fs::read(path).unwrap()),
                (format!("{key:06}.cls"), label.to_string().into_bytes()),
            ] {
                let mut header = tar::Header::new_ustar();
                header.set_size(bytes.len() as u64);
                header.set_mode(0o644);
                tar.append_data(&mut header, name, bytes.as_slice()).unwrap();
            }
        }
        tar.finish().unwrap();
    }
    format!("{}/s-{{0..{}}}.tar", out.display(), sizes.len() - 1)
}

#[test]
fn nproc_2_cpu_trains_on_uneven_tar_shards() {
    // 300 images in shards of 100, 90, 60 and 50: each rank reads its own run of shards, and
    // both take the same number of steps (or the run would hang at an all-reduce).
    let dir = tempfile::tempdir().unwrap();
    let spec = folder_as_shards(&dir.path().join("shards"), &[100, 90, 60, 50]);
    let how = ["--nproc", "2", "--cpu", "--shuffle-buffer", "32"];
    let (stdout, stderr) = train_one_epoch_on(&spec, &dir.path().join("run"), &how);
    assert!(stdout.contains("[rank 0] done: 1 epoch(s)"), "{stdout}\n{stderr}");
    // 20 % of each class held out; 240 / 2 ranks / batch 8 = 15 steps on each rank.
    assert!(stderr.contains("(10 classes): 240 train / 60 validation images"), "{stderr}");
    assert!(stderr.contains("15 steps/epoch"), "{stderr}");
}

#[test]
fn nproc_2_cpu_trains_end_to_end_over_tcp_with_sync_batch_norm() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (stdout, stderr) = train_two_on_the_jpeg_folder(&out, &["--nproc", "2", "--cpu", "--sync-bn"]);
    assert!(stdout.contains("[rank 0] done: 1 epoch(s)"), "{stdout}");
    assert!(!stdout.contains("[rank 1] done"), "only rank 0 reports: {stdout}");
    assert!(
        stderr.contains("2 device(s) x batch 8 = global batch 16") && stderr.contains("DDP, SyncBatchNorm"),
        "{stderr}"
    );
    assert!(stderr.contains("peak host memory"), "health table without memory: {stderr}");
    assert!(stderr.contains("rank 1:") && stderr.contains("gradient sync"), "health table missing: {stderr}");
    // The collectives' own share is measured (inside the all-reduce calls), beside the wait.
    let share: f64 = stderr
        .split("gradient sync: collectives ")
        .nth(1)
        .and_then(|s| s.split('%').next())
        .and_then(|s| s.parse().ok())
        .unwrap_or(-1.0);
    assert!(share > 0.0 && share < 100.0, "collectives' share {share}: {stderr}");
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    assert_eq!(metrics.lines().count(), 1, "one writer: {metrics}");
    let boards = std::fs::read_dir(out.join("tensorboard")).unwrap().count();
    assert_eq!(boards, 1, "rank 0 alone writes TensorBoard events");
    // Validation counted every held-out image exactly once across the two ranks: 60 of 300.
    let eval = cli(&["eval", "--checkpoint", out.join("last.ckpt").to_str().unwrap()]);
    let text = String::from_utf8_lossy(&eval.stdout);
    assert!(text.contains("60 images"), "{text}");
    // Distributed accuracy (two shards, tallies summed) equals one process evaluating the same
    // checkpoint on the same split.
    let record: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    let distributed = format!("top-1 {:.2}%", 100.0 * record["val_acc"].as_f64().unwrap());
    assert!(text.contains(&distributed), "single-process eval `{text}` vs distributed `{distributed}`");
}

/// Autocast-like bf16 activations in channels-last order, and f16 ones with loss scaling, train
/// end to end on the CPU (the same code paths as on a GPU, with burn's kernels); the run says
/// what it does and its checkpoint evaluates.
#[test]
fn vit_s16_trains_with_two_cpu_processes_mixup_and_clipped_gradients() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("vit");
    let args = [
        "train",
        "--model",
        "vit_s16",
        "--nproc",
        "2",
        "--cpu",
        "--epochs",
        "1",
        "--max-steps-per-epoch",
        "2",
        "--batch-size",
        "4",
        "--clip-grad-norm",
        "1.0",
        // Each rank mixes its own shard (its own draws), as timm's Mixup does.
        "--mixup",
        "0.8",
        "--cutmix",
        "1.0",
        "--drop-path",
        "0.1",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ];
    let o = cli(&args);
    assert_eq!(o.status.code(), Some(0), "{}", stderr(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("done: 1 epoch"), "{}", String::from_utf8_lossy(&o.stdout));
    assert!(out.join("last.ckpt").exists());
}

#[test]
fn half_precision_trains_end_to_end() {
    for (flags, says) in [
        (&["--precision", "bf16", "--channels-last"][..], "bf16 activations, channels-last"),
        (&["--precision", "f16"][..], "f16 activations"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let how: Vec<&str> = ["--cpu"].iter().chain(flags).copied().collect();
        let (_, log) = train_two_on_the_jpeg_folder(&out, &how);
        assert!(log.contains(says), "{log}");
        let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
        let record: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
        let loss = record["train_loss"].as_f64().unwrap();
        assert!(loss.is_finite() && loss > 0.0 && loss < 10.0, "{flags:?}: {record}");
        let eval = cli(&["eval", "--checkpoint", out.join("last.ckpt").to_str().unwrap()]);
        assert!(eval.status.success(), "{}", stderr(&eval));
    }
}

#[test]
fn data_parallel_2_cpu_workers_train_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (stdout, stderr) = train_two_on_the_jpeg_folder(&out, &["--strategy", "dp", "--nproc", "2", "--cpu"]);
    assert!(stderr.contains("2 device(s) x batch 8 = global batch 16") && stderr.contains("DataParallel"), "{stderr}");
    assert!(!stdout.contains("[rank"), "DataParallel is one process: {stdout}");
    let metrics = std::fs::read_to_string(out.join("metrics.jsonl")).unwrap();
    let record: serde_json::Value = serde_json::from_str(metrics.lines().next().unwrap()).unwrap();
    let loss = record["train_loss"].as_f64().unwrap();
    assert!(loss.is_finite() && loss > 0.0, "{record}");
    // Throughput after the first step (which carries one-time costs) is recorded beside the
    // epoch's; both count the images of both workers.
    let (all, steady) = (record["img_per_s"].as_f64().unwrap(), record["steady_img_per_s"].as_f64().unwrap());
    assert!(all > 0.0 && steady > 0.0, "{record}");
}

/// Two `train` processes started with a launcher's environment and no `--nproc` (what
/// torchrun, srun and mpirun do): the world comes from the environment, they form one DDP job
/// (rank 0 logs where the ranks came from, the learning rate is scaled by 2), rank 0 writes the
/// run, and rank 1 prints nothing.
fn launched_pair(out: &Path, env_of: impl Fn(usize) -> Vec<(&'static str, String)>) -> (Output, Output) {
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    let args = [
        "train",
        "--data",
        data.to_str().unwrap(),
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--batch-size",
        "8",
        "--max-steps-per-epoch",
        "2",
        "--quiet",
        "--cpu",
        "--out",
        out.to_str().unwrap(),
    ];
    let children: Vec<_> = (0..2)
        .map(|r| {
            Command::new(env!("CARGO_BIN_EXE_burn-vision"))
                .args(args)
                .envs(env_of(r))
                .env("RUST_LOG", "info")
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut outs = children.into_iter().map(|c| c.wait_with_output().unwrap());
    (outs.next().unwrap(), outs.next().unwrap())
}

/// A launcher's variables for rank `r` and store port `p`.
type LauncherEnv = Box<dyn Fn(usize, &str) -> Vec<(&'static str, String)>>;

#[test]
fn train_takes_its_world_from_torchrun_srun_or_mpirun() {
    let port = || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port().to_string();
    let launchers: [(&str, LauncherEnv); 3] = [
        (
            "RANK/WORLD_SIZE",
            Box::new(|r, p| {
                vec![
                    ("RANK", r.to_string()),
                    ("WORLD_SIZE", "2".into()),
                    ("LOCAL_RANK", r.to_string()),
                    ("MASTER_ADDR", "127.0.0.1".into()),
                    ("MASTER_PORT", p.into()),
                ]
            }),
        ),
        (
            "Slurm",
            Box::new(|r, p| {
                vec![
                    ("SLURM_PROCID", r.to_string()),
                    ("SLURM_NTASKS", "2".into()),
                    ("SLURM_LOCALID", r.to_string()),
                    ("SLURM_JOB_NODELIST", "localhost".into()),
                    ("MASTER_PORT", p.into()),
                ]
            }),
        ),
        (
            "OpenMPI",
            Box::new(|r, p| {
                vec![
                    ("OMPI_COMM_WORLD_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_SIZE", "2".into()),
                    ("OMPI_COMM_WORLD_LOCAL_RANK", r.to_string()),
                    ("OMPI_COMM_WORLD_LOCAL_SIZE", "2".into()),
                    ("MASTER_PORT", p.into()),
                ]
            }),
        ),
    ];
    for (name, env_of) in launchers {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("run");
        let p = port();
        let (rank0, rank1) = launched_pair(&out, |r| env_of(r, &p));
        let (err0, err1) = (stderr(&rank0), stderr(&rank1));
        assert!(rank0.status.success() && rank1.status.success(), "{name}:\n{err0}\n{err1}");
        assert!(
            err0.contains(&format!("2 ranks from {name}")),
            "{name}: rank 0 does not say where the world came from:\n{err0}"
        );
        assert!(
            err0.contains("global batch 16") && err0.contains("(0.002 x 2)"),
            "{name}: not one 2-rank job:\n{err0}"
        );
        assert!(String::from_utf8_lossy(&rank0.stdout).contains("done: 1 epoch(s)"), "{name}");
        assert!(rank1.stdout.is_empty(), "{name}: rank 1 printed {}", String::from_utf8_lossy(&rank1.stdout));
        assert!(out.join("last.ckpt").exists(), "{name}: no checkpoint");
    }
}

/// Whether a `--gpus 0` command ran; when it did not, checks that its answer is one line about
/// the device (a build without CUDA, no driver, no GPU) and says that `what` was skipped.
fn ran_on_gpu(o: &Output, what: &str) -> bool {
    if o.status.success() {
        return true;
    }
    let err = stderr(o);
    assert!(
        err.contains("--no-default-features") || err.to_lowercase().contains("gpu") || err.contains("CUDA"),
        "not a device error: {err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    eprintln!("SKIPPED {what} on GPU 0: {}", err.trim());
    false
}

/// `bench-data --gpus 0`: the batches delivered to GPU 0; without a CUDA build or a GPU, the
/// test says so and checks the one-line answer instead.
#[test]
fn bench_data_delivers_to_gpu_0() {
    let o = cli(&["bench-data", "--batch-size", "16", "--batches", "2", "--image-size", "28"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"delivered_to\":\"host memory\""),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    let o = cli(&["bench-data", "--batch-size", "16", "--batches", "2", "--image-size", "28", "--gpus", "0"]);
    if !ran_on_gpu(&o, "bench-data") {
        return;
    }
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("\"delivered_to\":\"gpu 0\""),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
}

/// `eval --gpus 0` and `predict --gpus 0` on a GPU; without a CUDA build or a GPU, the test
/// says so and checks the one-line answer instead.
#[test]
fn eval_and_predict_on_gpu_0() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    let o = cli(&[
        "train",
        "--data",
        data.to_str().unwrap(),
        "--image-size",
        "28",
        "--epochs",
        "1",
        "--batch-size",
        "16",
        "--max-steps-per-epoch",
        "2",
        "--quiet",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let ckpt = out.join("best.ckpt");
    let eval = cli(&["eval", "--gpus", "0", "--checkpoint", ckpt.to_str().unwrap()]);
    if !ran_on_gpu(&eval, "eval/predict") {
        return;
    }
    let text = String::from_utf8_lossy(&eval.stdout);
    assert!(text.contains("on gpu 0") && text.contains("top-1"), "{text}");
    let image = data.join("Bag");
    let o = cli(&["predict", "--gpus", "0", "--checkpoint", ckpt.to_str().unwrap(), image.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).lines().count(), 30, "the folder's 30 images");
}

/// `--profile-steps 2..4` on two CPU ranks: rank 0 writes a Chrome / Perfetto trace with a span
/// per step and phase on the training thread and DDP's bucket all-reduces on its
/// communication thread, inside the steps asked for.
#[test]
fn profile_steps_write_a_perfetto_trace_with_steps_phases_and_all_reduces() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let (_, stderr) = train_two_on_the_jpeg_folder(&out, &["--nproc", "2", "--cpu", "--profile-steps", "2..4"]);
    assert!(stderr.contains("trace.json"), "{stderr}");
    let trace: serde_json::Value = serde_json::from_slice(&std::fs::read(out.join("trace.json")).unwrap()).unwrap();
    let events = trace["traceEvents"].as_array().unwrap();
    let spans: Vec<&serde_json::Value> = events.iter().filter(|e| e["ph"] == "X").collect();
    let named = |n: &str| spans.iter().filter(|e| e["name"].as_str().is_some_and(|s| s.starts_with(n))).count();
    assert_eq!((named("step 2"), named("step 3"), named("step ")), (1, 1, 2), "steps 2 and 3 only");
    for phase in ["data", "upload", "forward", "backward", "optimizer"] {
        assert_eq!(named(phase), 2, "{phase}: one span per step");
    }
    assert!(named("all-reduce bucket") >= 2, "no bucket all-reduce spans: {trace}");
    let step = |n: &str| spans.iter().find(|e| e["name"] == n).unwrap();
    let (t0, t1) = (
        step("step 2")["ts"].as_f64().unwrap(),
        step("step 3")["ts"].as_f64().unwrap() + step("step 3")["dur"].as_f64().unwrap(),
    );
    for s in &spans {
        let (ts, dur) = (s["ts"].as_f64().unwrap(), s["dur"].as_f64().unwrap());
        assert!(ts >= t0 - 1.0 && ts + dur <= t1 + 1.0, "span outside the profiled steps: {s}");
        assert!(s["tid"].is_u64() && s["pid"] == 0, "{s}");
    }
    let comm = spans.iter().find(|e| e["cat"] == "comm").unwrap();
    assert!(comm["args"]["bytes"].as_u64().unwrap() > 0 && comm["args"]["backend"] == "tcp", "{comm}");
    let thread_names: Vec<&str> =
        events.iter().filter(|e| e["name"] == "thread_name").filter_map(|e| e["args"]["name"].as_str()).collect();
    assert!(thread_names.iter().any(|n| n.starts_with("burn-ddp-comm")), "{thread_names:?}");
}

/// `plot` draws two runs' curves into a PNG that decodes, has the promised size, is not blank,
/// and shows each run in its own colour; a folder without metrics gets one line.
#[test]
fn plot_draws_runs_overlaid_into_a_png() {
    let dir = tempfile::tempdir().unwrap();
    for (name, speed) in [("1gpu", 900.0), ("2gpu", 1700.0)] {
        let run = dir.path().join(name);
        std::fs::create_dir_all(&run).unwrap();
        let lines: Vec<String> = (1..=4)
            .map(|e| {
                let e = e as f64;
                serde_json::json!({ "epoch": e, "train_loss": 2.0 / e, "val_loss": 2.2 / e, "train_acc": 0.2 * e, "val_acc": 0.18 * e, "lr": 0.1 / e, "img_per_s": speed + e }).to_string()
            })
            .collect();
        std::fs::write(run.join("metrics.jsonl"), lines.join("\n") + "\n").unwrap();
    }
    let png = dir.path().join("curves.png");
    let (a, b) = (dir.path().join("1gpu"), dir.path().join("2gpu"));
    let o = cli(&["plot", a.to_str().unwrap(), b.to_str().unwrap(), "-o", png.to_str().unwrap()]);
    assert!(o.status.success(), "{}", stderr(&o));
    let img = image::open(&png).unwrap().to_rgb8();
    assert_eq!(img.dimensions(), (1400, 900));
    let inked = img.pixels().filter(|p| p.0.iter().any(|&c| c < 200)).count();
    assert!(inked > 1400 * 900 / 100, "almost blank: {inked} dark pixels");
    // Saturated pixels (lines and markers) in at least two clearly different hues.
    let hues: std::collections::BTreeSet<u8> = img
        .pixels()
        .filter(|p| {
            let (mx, mn) = (*p.0.iter().max().unwrap() as i32, *p.0.iter().min().unwrap() as i32);
            mx - mn > 90
        })
        .map(|p| (p.0.iter().enumerate().max_by_key(|(_, c)| **c).unwrap().0) as u8)
        .collect();
    assert!(hues.len() >= 2, "the runs are not told apart by colour: {hues:?}");
    let err = stderr(&cli(&["plot", dir.path().join("none").to_str().unwrap(), "-o", png.to_str().unwrap()]));
    assert!(err.contains("metrics.jsonl") && err.trim().lines().count() == 1, "{err}");
}

/// The augmentation flags reach the pipeline: the first log line and the checkpoint say what
/// was used, and turning flips off, jitter, erasing or RandAugment on changes what the model sees (the same
/// seed otherwise gives bit-identical runs).
#[test]
fn augmentation_flags_are_used_logged_and_recorded() {
    let dir = tempfile::tempdir().unwrap();
    let run = |name: &str, how: &[&str]| {
        let out = dir.path().join(name);
        let mut args = vec!["--max-steps-per-epoch", "3"];
        args.extend_from_slice(how);
        let (_, err) = train_two_on_the_jpeg_folder(&out, &args);
        let metrics: serde_json::Value =
            serde_json::from_str(std::fs::read_to_string(out.join("metrics.jsonl")).unwrap().lines().next().unwrap())
                .unwrap();
        (err, metrics["train_loss"].as_f64().unwrap(), out)
    };
    let (default_log, default_loss, _) = run("default", &[]);
    assert!(default_log.contains("augmentation: flip 0.5, crop scale 0.08–1"), "{default_log}");
    let (again_log, again_loss, _) = run("again", &[]);
    assert_eq!(default_loss, again_loss, "same seed, same run: {again_log}");
    let (log, loss, out) =
        run("strong", &["--hflip", "0", "--rrc-scale", "0.35,1", "--color-jitter", "0.4", "--random-erasing", "0.5"]);
    assert!(
        log.contains("augmentation: flip 0, crop scale 0.35–1")
            && log.contains("colour jitter 0.4, random erasing 0.5"),
        "{log}"
    );
    assert_ne!(loss, default_loss, "the flags changed nothing");
    let eval = cli(&["eval", "--checkpoint", out.join("last.ckpt").to_str().unwrap()]);
    assert!(eval.status.success(), "{}", stderr(&eval));
    let bytes = std::fs::read(out.join("last.ckpt")).unwrap();
    let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[20..20 + len]).unwrap();
    assert_eq!(meta["config"]["augment"]["color_jitter"], 0.4, "{meta}");
    assert_eq!(meta["config"]["augment"]["hflip"], 0.0, "{meta}");
    // RandAugment: logged, changes training, a bad value is one line naming the flag.
    let (log, rand_loss, _) = run("randaugment", &["--randaugment", "2,9"]);
    assert!(log.contains("RandAugment 2 ops at magnitude 9"), "{log}");
    assert_ne!(rand_loss, default_loss, "RandAugment changed nothing");
    let bad = stderr(&cli(&["train", "--randaugment", "2,31", "--out", dir.path().join("bad0").to_str().unwrap()]));
    assert!(bad.contains("--randaugment") && bad.trim().lines().count() == 1, "{bad}");
    // Mixup / cutmix: logged, recorded, changes training, and reproducible (pure draws).
    let mix = ["--mixup", "0.8", "--cutmix", "1.0", "--mixup-switch-prob", "0.5"];
    let (log, mixed_loss, out) = run("mixed", &mix);
    assert!(log.contains("mixup α 0.8 cutmix α 1 (p 1, switch 0.5)"), "{log}");
    assert_ne!(mixed_loss, default_loss, "mixing changed nothing");
    let (_, mixed_again, _) = run("mixed-again", &mix);
    assert_eq!(mixed_loss, mixed_again, "the same seed mixes the same way");
    let bytes = std::fs::read(out.join("last.ckpt")).unwrap();
    let len = u64::from_le_bytes(bytes[12..20].try_into().unwrap()) as usize;
    let meta: serde_json::Value = serde_json::from_slice(&bytes[20..20 + len]).unwrap();
    assert_eq!(meta["config"]["mixup"]["cutmix_alpha"], 1.0, "{meta}");
    let bad = stderr(&cli(&["train", "--mixup-prob", "2", "--out", dir.path().join("bad").to_str().unwrap()]));
    assert!(bad.contains("--mixup-prob") && bad.trim().lines().count() == 1, "{bad}");
    let bad = stderr(&cli(&["train", "--drop-path", "0.1", "--out", dir.path().join("bad2").to_str().unwrap()]));
    assert!(
        bad.contains("--drop-path") && bad.contains("no stochastic depth") && bad.trim().lines().count() == 1,
        "{bad}"
    );
}

/// `bench --optimizer adamw` steps with AdamW: the same model, data and seed end at another loss
/// than SGD's, and the JSON says which optimizer ran.
#[test]
fn bench_runs_adamw_as_well_as_sgd() {
    let last_loss = |optimizer: &str| {
        let args = "bench --model resnet10-mini --batch-size 4 --image-size 28 --channels 1 --classes 10 \
                    --small-input --warmup 1 --steps 3 --optimizer";
        let o = cli(&args.split_whitespace().chain([optimizer]).collect::<Vec<_>>());
        assert!(o.status.success(), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        assert_eq!(r["config"]["optimizer"], optimizer, "{r}");
        r["last_loss"].as_f64().unwrap()
    };
    let (sgd, adamw) = (last_loss("sgd"), last_loss("adamw"));
    assert!(sgd.is_finite() && adamw.is_finite() && sgd != adamw, "sgd {sgd}, adamw {adamw}");
}

/// `bench --channels-last` on the CPU: the batch is held channels-last and viewed as NCHW (as
/// on a GPU), and the model trains on it.
#[test]
fn bench_runs_channels_last() {
    let o = mini_bench(&["--steps", "2", "--channels-last"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["config"]["channels_last"], true, "{r}");
    assert!(r["last_loss"].as_f64().unwrap().is_finite(), "{r}");
}

/// `bench` of the smallest model on 28² single-channel images, batch 4, 2 warm-up steps, with
/// `extra` flags.
fn mini_bench(extra: &[&str]) -> Output {
    let base = ["bench", "--model", "resnet10-mini", "--batch-size", "4", "--image-size", "28", "--channels", "1"];
    let more = ["--classes", "10", "--small-input", "--warmup", "2"];
    cli(&[&base[..], &more[..], extra].concat())
}

/// `bench --ddp --ddp-interleave 2` over 6 steps on the CPU (a one-rank TCP group): three
/// blocks, plain / DDP / plain, one pair ratio, DDP's per-step figures over its 2 steps.
#[test]
fn bench_interleaves_plain_and_ddp_blocks() {
    let o = mini_bench(&["--steps", "6", "--ddp", "--ddp-interleave", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let i = &r["interleaved"];
    assert_eq!(i["block_steps"], 2);
    assert_eq!(i["pair_ratios"].as_array().unwrap().len(), 1, "{i}");
    for key in ["plain_img_per_s", "ddp_img_per_s", "ratio", "median_pair_ratio"] {
        let v = i[key].as_f64().unwrap();
        assert!(v.is_finite() && v > 0.0, "{key}: {i}");
    }
    // Every DDP step all-reduced its buckets: a whole number of buckets per DDP step.
    let buckets = r["ddp"]["buckets"].as_f64().unwrap();
    assert!(buckets >= 1.0 && buckets.fract() == 0.0, "{}", r["ddp"]);
}

/// `--bucket-cap-mb` reaches DDP: smaller buckets, more of them a step.
#[test]
fn bench_bucket_cap_sets_the_buckets() {
    let buckets = |extra: &[&str]| {
        let o = mini_bench(&[&["--steps", "1", "--ddp"], extra].concat());
        assert!(o.status.success(), "{}", stderr(&o));
        let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
        r["ddp"]["buckets"].as_f64().unwrap()
    };
    let (default, small) = (buckets(&[]), buckets(&["--bucket-cap-mb", "0.01"]));
    assert!(default >= 1.0 && small > default, "25 MiB: {default} buckets, 10 KiB: {small}");
}

/// `bench` on the CPU prints one JSON line whose first-step split adds up: the whole wait from
/// the process's start covers the first step, which covers its cuDNN share (none here).
#[test]
fn bench_reports_the_first_step_split() {
    let o = mini_bench(&["--steps", "2"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let f = &r["first_step"];
    let (setup, step, cudnn, total) = (
        f["setup_s"].as_f64().unwrap(),
        f["step_s"].as_f64().unwrap(),
        f["cudnn_s"].as_f64().unwrap(),
        f["total_s"].as_f64().unwrap(),
    );
    assert!(step > 0.0 && cudnn == 0.0 && total >= setup + step - 1e-3, "{f}");
    assert!(r["device_used_gib"].is_null() && r["img_per_s"].as_f64().unwrap() > 0.0, "{r}");
    // No GPU layer ran: no options to report, no filter reordered.
    assert!(r["gpu_options"].is_null() && r["filter_kernel_passes"] == 0, "{r}");
}

/// An I/O failure names its cause once ("Not a directory (os error 20)", not twice).
#[test]
fn an_io_error_is_said_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("a-file");
    std::fs::write(&file, b"x").unwrap();
    let out = cli(&["train", "--out", file.join("run").to_str().unwrap(), "--epochs", "1", "--quiet"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert_eq!(err.matches("os error").count(), 1, "the cause is repeated: {err}");
}
