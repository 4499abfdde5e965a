//! README's "Multi-GPU for your Burn model" as a newcomer reads it: its program is
//! `examples/first_program.rs` character for character, its dependency block names every crate
//! the program uses at the workspace's versions, and the program runs alone (a world of one,
//! no launcher) and under `burn-ddp launch --nproc-per-node 2`, learning the same model on both
//! ranks.

use std::path::{Path, PathBuf};
use std::process::Command;

mod common;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

fn readme_section() -> String {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let start = readme.find("## Multi-GPU for your Burn model").expect("README has the section");
    let rest = &readme[start + 3..];
    rest[..rest.find("\n## ").unwrap_or(rest.len())].to_string()
}

/// The text of the first fenced block of `lang` in `section`.
fn fenced(section: &str, lang: &str) -> String {
    let open = format!("```{lang}\n");
    let start = section.find(&open).unwrap_or_else(|| panic!("no ```{lang} block in README's section")) + open.len();
    section[start..start + section[start..].find("```").unwrap()].to_string()
}

#[test]
fn readme_quotes_the_program_whole() {
    let program = std::fs::read_to_string(root().join("burn-ddp/examples/first_program.rs")).unwrap();
    assert_eq!(
        fenced(&readme_section(), "rust"),
        program,
        "README's program and examples/first_program.rs differ: copy the file into README"
    );
}

#[test]
fn readme_dependencies_cover_the_program_at_the_workspace_versions() {
    let deps = fenced(&readme_section(), "toml");
    let workspace = std::fs::read_to_string(root().join("Cargo.toml")).unwrap();
    let program = std::fs::read_to_string(root().join("burn-ddp/examples/first_program.rs")).unwrap();
    let listed: Vec<(String, String)> = deps
        .lines()
        .filter(|l| l.contains(" = ") && !l.starts_with('['))
        .map(|l| {
            let (name, spec) = l.split_once(" = ").unwrap();
            (name.trim().to_string(), spec.split('#').next().unwrap().trim().to_string())
        })
        .collect();
    for krate in ["burn", "burn_autodiff", "burn_ddp", "burn_flex", "burn_nn", "burn_optim"] {
        assert!(program.contains(&format!("use {krate}::")), "the program no longer uses {krate}: update this list");
        let name = krate.replace('_', "-");
        assert!(listed.iter().any(|(n, _)| *n == name), "README's dependency block lacks {name}:\n{deps}");
    }
    for (name, spec) in &listed {
        let version = spec
            .split("version = ")
            .nth(1)
            .map_or(spec.as_str(), |v| v.split([',', ' ', '}']).next().unwrap())
            .trim_matches('"');
        if name == "burn-ddp" {
            continue;
        }
        let ours = workspace
            .lines()
            .find(|l| l.starts_with(&format!("{name} = ")))
            .unwrap_or_else(|| panic!("{name} is not a workspace dependency"));
        assert!(ours.contains(&format!("\"{version}\"")), "README pins {name} at {version}, the workspace has: {ours}");
    }
}

fn program() -> PathBuf {
    common::example_binary("first_program")
}

/// Each rank's `(first epoch's loss, last epoch's loss, held-out accuracy)` from the output.
fn learned(stdout: &str, rank: usize) -> (f64, f64, String) {
    let losses: Vec<f64> = stdout
        .lines()
        .filter(|l| l.contains(&format!("rank {rank}/")))
        .filter_map(|l| l.rsplit("loss ").next()?.trim().parse().ok())
        .collect();
    let accuracy = stdout
        .lines()
        .find_map(|l| l.split(&format!("rank {rank}: held-out accuracy ")).nth(1))
        .unwrap_or_else(|| panic!("rank {rank} printed no accuracy:\n{stdout}"));
    assert!(losses.len() >= 2, "rank {rank} printed {} epoch lines:\n{stdout}", losses.len());
    (losses[0], *losses.last().unwrap(), accuracy.trim().to_string())
}

#[test]
fn the_program_learns_alone_without_a_launcher() {
    let out = Command::new(program())
        .env_remove("RANK")
        .env_remove("WORLD_SIZE")
        .env_remove("SLURM_PROCID")
        .env_remove("OMPI_COMM_WORLD_RANK")
        .env_remove("PMIX_RANK")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}\n{}", String::from_utf8_lossy(&out.stderr));
    let (first, last, accuracy) = learned(&stdout, 0);
    assert!(
        last < 0.7 * first && accuracy.parse::<f64>().unwrap() > 0.9,
        "loss {first} -> {last}, accuracy {accuracy}:\n{stdout}"
    );
}

#[test]
fn the_program_learns_the_same_model_on_two_launched_ranks() {
    let out = Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--"])
        .arg(program())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{stdout}\n{stderr}");
    let (rank0, rank1) = (learned(&stdout, 0), learned(&stdout, 1));
    assert!(stdout.contains("rank 0/2 epoch") && stdout.contains("rank 1/2 epoch"), "{stdout}");
    assert_eq!(rank0.2, rank1.2, "the ranks' models differ:\n{stdout}");
    for (first, last, accuracy) in [rank0, rank1] {
        assert!(
            last < 0.7 * first && accuracy.parse::<f64>().unwrap() > 0.9,
            "loss {first} -> {last}, accuracy {accuracy}:\n{stdout}"
        );
    }
}
