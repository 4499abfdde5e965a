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
    let cases: [(&[&str], &str); 5] = [
        (&["train", "--data", "/no/such/folder", "--quiet"], "does not exist"),
        (&["train", "--model", "vgg16", "--quiet"], "available: resnet10-mini"),
        (&["train", "--gpus", "0,x"], "`x` is not a GPU number"),
        (&["train", "--batch-size", "0"], "--batch-size"),
        (&["predict", "--checkpoint", "/no/such.ckpt", "x.png"], "file not found"),
    ];
    for (args, expected) in cases {
        let out = cli(args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let err = stderr(&out);
        assert!(err.contains(expected), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?} printed more than one line: {err}");
    }
}

#[cfg(not(feature = "cuda"))]
#[test]
fn gpus_without_cuda_build_says_how_to_get_it() {
    let err = stderr(&cli(&["train", "--gpus", "0"]));
    assert!(err.contains("--features cuda"), "{err}");
}

#[test]
fn train_then_eval_and_predict() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let data = Path::new(env!("CARGO_MANIFEST_DIR")).join("../datasets/fashion-mnist-folder");
    let data = data.to_str().unwrap();
    let o = cli(&["train", "--data", data, "--image-size", "28", "--epochs", "1", "--batch-size", "16", "--quiet", "--out", out.to_str().unwrap()]);
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

    let corrupt = dir.path().join("bad.ckpt");
    let mut bytes = std::fs::read(&ckpt).unwrap();
    bytes.truncate(bytes.len() / 2);
    std::fs::write(&corrupt, bytes).unwrap();
    let err = stderr(&cli(&["eval", "--checkpoint", corrupt.to_str().unwrap()]));
    assert!(err.contains("truncated or corrupt"), "{err}");
}
