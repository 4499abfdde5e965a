//! Helpers for multi-process tests: re-execute this test binary once per rank.

#![allow(dead_code)]

pub mod mlp;
pub mod vit_block;

use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const HARD_TIMEOUT: Duration = Duration::from_secs(120);

pub fn is_worker() -> bool {
    std::env::var("BURN_DDP_TEST_ROLE").is_ok()
}

/// Runs `test` in `ranks` child processes of a `world`-rank group and returns their outputs.
pub fn spawn(test: &str, world: usize, ranks: &[usize], extra: &[(&str, String)]) -> Vec<Output> {
    let port = burn_ddp::launch::free_port().unwrap();
    let children: Vec<_> = ranks
        .iter()
        .map(|&rank| {
            let mut c = Command::new(std::env::current_exe().unwrap());
            c.args([test, "--exact", "--nocapture", "--test-threads=1"])
                .env("BURN_DDP_TEST_ROLE", "worker")
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", port.to_string())
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped());
            for (k, v) in extra {
                c.env(k, v);
            }
            c.spawn().unwrap()
        })
        .collect();
    let start = Instant::now();
    let mut children = children;
    loop {
        if children.iter_mut().all(|c| matches!(c.try_wait(), Ok(Some(_)))) {
            break;
        }
        if start.elapsed() > HARD_TIMEOUT {
            for c in &mut children {
                let _ = c.kill();
            }
            panic!("{test}: ranks still running after {HARD_TIMEOUT:?} (hang)");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    children.into_iter().map(|c| c.wait_with_output().unwrap()).collect()
}

pub fn assert_all_ok(test: &str, outs: &[Output]) {
    for (r, o) in outs.iter().enumerate() {
        assert!(
            o.status.success(),
            "{test} rank {r} failed:\n{}\n{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        );
    }
}

/// The example `name`, which `cargo test` builds beside the test binaries
/// (`target/<profile>/examples/`).
pub fn example_binary(name: &str) -> std::path::PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_path_buf();
    let exe = deps.parent().unwrap().join("examples").join(format!("{name}{}", std::env::consts::EXE_SUFFIX));
    assert!(
        exe.exists(),
        "{} is missing: run the tests through `cargo test`, which builds the examples",
        exe.display()
    );
    exe
}
