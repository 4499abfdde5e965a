//! The plain-Burn example (`examples/plain_burn.rs`: burn-nn + burn-ddp only) under `burn-ddp
//! launch` with two CPU processes: both ranks finish, end with the same trained parameters, and
//! the loss falls.

use std::path::PathBuf;
use std::process::Command;

mod common;

fn example_binary() -> PathBuf {
    common::example_binary("plain_burn")
}

/// `(rank, first_loss, last_loss, params)` from a `RESULT` line.
fn parse(line: &str) -> (usize, f32, f32, String) {
    let field = |key: &str| {
        line.split_whitespace()
            .find_map(|w| w.strip_prefix(key))
            .unwrap_or_else(|| panic!("no {key} in {line}"))
            .to_string()
    };
    (
        field("rank=").parse().unwrap(),
        field("first_loss=").parse().unwrap(),
        field("last_loss=").parse().unwrap(),
        field("params="),
    )
}

#[test]
fn two_cpu_ranks_train_the_plain_burn_model_identically() {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--"])
        .arg(example_binary())
        .args(["--steps", "40", "--batch", "16"])
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "launch failed:\n{stdout}\n{stderr}");
    let results: Vec<_> = stdout.lines().filter(|l| l.contains("RESULT rank=")).map(parse).collect();
    assert_eq!(results.len(), 2, "expected one RESULT line per rank:\n{stdout}\n{stderr}");
    assert_eq!(results[0].3, results[1].3, "ranks ended with different parameters:\n{stdout}");
    assert_ne!(results[0].3, "cbf29ce484222325", "the checksum covered no parameter");
    for (rank, first, last, _) in &results {
        assert!(*last < 0.6 * first, "rank {rank}: loss {first} -> {last} did not fall:\n{stdout}\n{stderr}");
    }
    assert!(stderr.contains("convolutions: burn's kernels"), "the convolution path is not logged:\n{stderr}");
}
