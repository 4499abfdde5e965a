//! The `burn-ddp launch` binary on real processes: environment, rank prefixes, tear-down on
//! failure with the failing code, restarts.

use burn_ddp::ProcessGroup;
use std::process::Command;
use std::time::{Duration, Instant};

fn launch(args: &[&str]) -> (i32, String, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_burn-ddp")).arg("launch").args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned(), t.elapsed())
}

#[test]
fn every_rank_gets_its_environment_and_a_prefix() {
    let script = "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT";
    let (code, out, err, _) = launch(&["--standalone", "--nproc-per-node", "3", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    for r in 0..3 {
        let line = out.lines().find(|l| l.starts_with(&format!("[rank {r}] "))).unwrap_or_else(|| panic!("no line for rank {r}: {out}"));
        assert!(line.contains(&format!("rank={r} world=3 local={r} lws=3 addr=127.0.0.1 port=")), "{line}");
        assert!(!line.ends_with("port="), "port missing: {line}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    let script = r#"if [ "$RANK" = 1 ]; then sleep 0.3; echo failing >&2; exit 7; fi; sleep 60"#;
    let (code, _, err, elapsed) = launch(&["--standalone", "--nproc-per-node", "3", "--grace-s", "1", "--", "sh", "-c", script]);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("[rank 1] failing"), "{err}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}: the other ranks were not stopped");
}

#[test]
fn max_restarts_restarts_the_whole_group() {
    // Fails on the first attempt only.
    let script = r#"if [ "$BURN_DDP_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then exit 3; fi; echo attempt=$BURN_DDP_RESTART_COUNT"#;
    let (code, out, err, _) = launch(&["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[rank 0] attempt=1") && out.contains("[rank 1] attempt=1"), "{out}");
    let (code, _, _, _) = launch(&["--standalone", "--nproc-per-node", "2", "--", "sh", "-c", "exit 3"]);
    assert_eq!(code, 3);
}

#[test]
fn a_missing_program_is_one_clear_error() {
    let (code, _, err, _) = launch(&["--nproc-per-node", "1", "--", "/no/such/program"]);
    assert_eq!(code, 1);
    assert!(err.contains("starting `/no/such/program` for rank 0"), "{err}");
}

#[test]
fn launched_ranks_form_a_tcp_group() {
    // The launcher, rendezvous and tcp group together: the test binary's own worker mode.
    let exe = std::env::current_exe().unwrap();
    let (code, out, err, _) = launch(&["--standalone", "--nproc-per-node", "2", "--", exe.to_str().unwrap(), "launched_worker_joins", "--exact", "--ignored", "--nocapture"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("[rank 0] worker joined") && out.contains("[rank 1] worker joined"), "{out}");
}

#[test]
#[ignore = "worker of launched_ranks_form_a_tcp_group: runs only under the launcher"]
fn launched_worker_joins() {
    let cfg = burn_ddp::RendezvousConfig::from_env().unwrap();
    let pg = burn_ddp::init_process_group(burn_ddp::CommBackend::Tcp, &cfg).unwrap();
    let mut v = [pg.rank() as f64 + 1.0];
    burn_ddp::tensor::all_reduce_f64(&*pg, &mut v, burn_ddp::ReduceOp::Sum).unwrap();
    assert_eq!(v[0], 3.0);
    println!("worker joined");
}
