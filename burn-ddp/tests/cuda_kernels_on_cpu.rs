//! burn-ddp's own CUDA C kernels (the fused bias + GELU, the layer-norm forward) run on the CPU
//! against f64, through `benches/emulate_kernels.py`: g++ compiles their source with the CUDA
//! built-ins they use emulated. It checks the kernels' indexing and arithmetic on a machine
//! without a GPU (CI's); `burn-ddp-gpu-checks` checks them on one. Skipped, visibly, where
//! python3 or a g++ with `_Float16` and C++20 is missing.

use std::path::Path;
use std::process::Command;

fn tool_runs(program: &str) -> bool {
    Command::new(program).arg("--version").output().is_ok_and(|o| o.status.success())
}

#[test]
fn our_cuda_kernels_match_f64_when_emulated_on_the_cpu() {
    if !tool_runs("python3") || !tool_runs("g++") || !cfg!(target_arch = "x86_64") {
        eprintln!("SKIPPED: emulating the CUDA kernels needs python3 and g++ on x86-64");
        return;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../benches/emulate_kernels.py");
    let out = Command::new("python3").arg(&script).output().expect("running emulate_kernels.py");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    if stderr.contains("_Float16") && !out.status.success() {
        eprintln!("SKIPPED: this g++ has no _Float16 (g++ 12 or later has):\n{stderr}");
        return;
    }
    assert!(out.status.success() && stdout.contains("ALL OK"), "the emulated kernels failed:\n{stdout}\n{stderr}");
    // Every path ran: 48 GELU cases, the bf16 rounding check and 8 layer-norm cases.
    assert_eq!(stdout.lines().filter(|l| l.ends_with(" ok")).count(), 57, "{stdout}");
}
