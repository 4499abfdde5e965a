//! The `burn-ddp launch` binary on real processes: environment, rank prefixes, tear-down on
//! failure with the failing code, restarts.

use burn_ddp::ProcessGroup;
use std::process::Command;
use std::time::{Duration, Instant};

fn launch(args: &[&str]) -> (i32, String, String, Duration) {
    let t = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_burn-ddp")).arg("launch").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        t.elapsed(),
    )
}

#[test]
fn every_rank_gets_its_environment_and_a_prefix() {
    let script = "echo rank=$RANK world=$WORLD_SIZE local=$LOCAL_RANK lws=$LOCAL_WORLD_SIZE addr=$MASTER_ADDR port=$MASTER_PORT timeout=$BURN_DDP_TIMEOUT_S";
    let (code, out, err, _) =
        launch(&["--standalone", "--nproc-per-node", "3", "--timeout-s", "7.5", "--", "sh", "-c", script]);
    assert_eq!(code, 0, "{err}");
    for r in 0..3 {
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("[rank {r}] ")))
            .unwrap_or_else(|| panic!("no line for rank {r}: {out}"));
        assert!(line.contains(&format!("rank={r} world=3 local={r} lws=3 addr=127.0.0.1 port=")), "{line}");
        assert!(!line.contains("port= "), "port missing: {line}");
        assert!(line.ends_with("timeout=7.5"), "--timeout-s did not reach the rank: {line}");
    }
}

#[test]
fn a_failing_rank_stops_the_others_and_sets_the_exit_code() {
    let script = r#"if [ "$RANK" = 1 ]; then sleep 0.3; echo failing >&2; exit 7; fi; sleep 60"#;
    let (code, _, err, elapsed) =
        launch(&["--standalone", "--nproc-per-node", "3", "--grace-s", "1", "--", "sh", "-c", script]);
    assert_eq!(code, 7, "{err}");
    assert!(err.contains("[rank 1] failing"), "{err}");
    assert!(elapsed < Duration::from_secs(15), "took {elapsed:?}: the other ranks were not stopped");
}

#[test]
fn max_restarts_restarts_the_whole_group() {
    // Fails on the first attempt only.
    let script = r#"if [ "$BURN_DDP_RESTART_COUNT" = 0 ] && [ "$RANK" = 0 ]; then exit 3; fi; echo attempt=$BURN_DDP_RESTART_COUNT"#;
    let (code, out, err, _) =
        launch(&["--standalone", "--nproc-per-node", "2", "--max-restarts", "1", "--", "sh", "-c", script]);
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
    let (code, out, err, _) = launch(&[
        "--standalone",
        "--nproc-per-node",
        "2",
        "--",
        exe.to_str().unwrap(),
        "launched_worker_joins",
        "--exact",
        "--ignored",
        "--nocapture",
    ]);
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

/// Two nodes started with the same `--node-rank`: a duplicate rank stops at once naming the
/// cause, and every rank of both nodes ends within the rendezvous time-out — no hang.
/// A node rank outside `--nnodes`, or several nodes without `--master-addr`, never start.
#[test]
fn wrong_node_ranks_are_one_line_errors() {
    let (code, _, err, _) = launch(&["--nnodes", "2", "--node-rank", "2", "--master-addr", "127.0.0.1", "--", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("--node-rank 2 is outside --nnodes 2"), "{err}");
    let (code, _, err, _) = launch(&["--nnodes", "2", "--node-rank", "0", "--", "true"]);
    assert_eq!(code, 2);
    assert!(err.contains("needs --master-addr"), "{err}");

    let port = burn_ddp::launch::free_port_pair().unwrap().to_string();
    let exe = std::env::current_exe().unwrap();
    let started = Instant::now();
    let nodes: Vec<_> = (0..2)
        .map(|_| {
            Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
                .args([
                    "launch",
                    "--nnodes",
                    "2",
                    "--node-rank",
                    "0",
                    "--master-addr",
                    "127.0.0.1",
                    "--master-port",
                    &port,
                    "--nproc-per-node",
                    "2",
                    "--grace-s",
                    "1",
                    "--",
                ])
                .arg(&exe)
                .args(["launched_worker_joins", "--exact", "--ignored", "--nocapture"])
                .env("BURN_DDP_TIMEOUT_S", "4")
                .stderr(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outs: Vec<_> = nodes.into_iter().map(|n| n.wait_with_output().unwrap()).collect();
    let all: String = outs
        .iter()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
        .collect();
    assert!(outs.iter().all(|o| !o.status.success()), "a duplicate node rank must fail both nodes:\n{all}");
    // Which node's rank gets there second is a race: it says "joined twice" (rank 1) or finds
    // rank 0's port taken; the other node then loses its peers or its store and stops too.
    // Since the launchers agree through their own store, the second node 0 cannot start it
    // and says so; the first waits for a node 1 that never comes, within the time-out.
    assert!(
        all.contains("joined twice") || all.contains("another launcher is node 0 already"),
        "the duplicate is not named:\n{all}"
    );
    assert!(started.elapsed() < Duration::from_secs(30), "took {:?}", started.elapsed());
}

/// `burn-ddp doctor` prints one line per check and exits 0 on a sound single-node set-up (a
/// real loopback all-reduce among 2 local ranks included), 1 when a check fails: loopback
/// MASTER_ADDR for two nodes, a port already taken.
#[test]
fn doctor_reports_one_line_per_check_and_fails_on_real_mistakes() {
    let doctor = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
            .arg("doctor")
            .args(args)
            .env_remove("MASTER_ADDR")
            .env_remove("MASTER_PORT")
            .output()
            .unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let port = burn_ddp::launch::free_port_pair().unwrap().to_string();
    let (code, table) = doctor(&["--nproc-per-node", "2", "--master-port", &port, "--all-reduce-mib", "4"]);
    assert!(code == 0 || table.contains("FAIL  GPUs"), "{table}");
    for name in ["MASTER_ADDR", "MASTER_PORT", "GPUs", "variables", "firewall", "all-reduce"] {
        assert!(table.lines().any(|l| l.split_whitespace().nth(1) == Some(name)), "no {name} line:\n{table}");
    }
    assert!(table.contains("pass  all-reduce") && table.contains("sum correct") && table.contains("GB/s"), "{table}");

    let (code, table) = doctor(&["--nnodes", "2", "--master-port", &port, "--all-reduce-mib", "0"]);
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("FAIL  MASTER_ADDR") && table.contains("loopback"), "{table}");
    assert!(!table.contains("all-reduce"), "--all-reduce-mib 0 skips it:\n{table}");

    let held = std::net::TcpListener::bind("0.0.0.0:0").unwrap();
    let busy = held.local_addr().unwrap().port().to_string();
    let (code, table) = doctor(&["--master-port", &busy, "--all-reduce-mib", "0"]);
    assert_eq!(code, 1, "{table}");
    assert!(table.contains("FAIL  MASTER_PORT"), "{table}");
}

/// Two launchers as two nodes (one rank each): rank 1 on node 1 fails in the first round while
/// rank 0 on node 0 would wait a minute. Node 0's launcher hears of it through the launchers'
/// store, stops its rank at once, and both nodes start round 2 together, which succeeds. Without
/// restarts, both launchers exit with the failing rank's code, well before any time-out.
#[test]
fn a_failure_on_one_node_ends_the_round_on_every_node() {
    let script = r#"if [ "$BURN_DDP_RESTART_COUNT" = 0 ]; then if [ "$RANK" = 1 ]; then sleep 0.5; exit 5; fi; sleep 60; fi; echo "round $BURN_DDP_RESTART_COUNT ok rank $RANK""#;
    for restarts in ["1", "0"] {
        let port = burn_ddp::launch::free_port_pair().unwrap().to_string();
        let t = Instant::now();
        let nodes: Vec<_> = (0..2)
            .map(|node| {
                Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
                    .args([
                        "launch",
                        "--nnodes",
                        "2",
                        "--node-rank",
                        &node.to_string(),
                        "--master-addr",
                        "127.0.0.1",
                        "--master-port",
                        &port,
                    ])
                    .args([
                        "--nproc-per-node",
                        "1",
                        "--grace-s",
                        "1",
                        "--timeout-s",
                        "60",
                        "--max-restarts",
                        restarts,
                        "--",
                        "sh",
                        "-c",
                        script,
                    ])
                    .stdout(std::process::Stdio::piped())
                    .stderr(std::process::Stdio::piped())
                    .spawn()
                    .unwrap()
            })
            .collect();
        let outs: Vec<_> = nodes.into_iter().map(|c| c.wait_with_output().unwrap()).collect();
        let elapsed = t.elapsed();
        let text = |i: usize| {
            format!("{}{}", String::from_utf8_lossy(&outs[i].stdout), String::from_utf8_lossy(&outs[i].stderr))
        };
        assert!(
            elapsed < Duration::from_secs(20),
            "took {elapsed:?}: node 0 did not hear of node 1's failure\n{}\n{}",
            text(0),
            text(1)
        );
        if restarts == "1" {
            for (i, o) in outs.iter().enumerate() {
                assert!(o.status.success(), "node {i}:\n{}", text(i));
                assert!(
                    text(i).contains(&format!("round 1 ok rank {i}")),
                    "node {i} did not run round 2:\n{}",
                    text(i)
                );
            }
            assert!(text(0).contains("rank 1 on node 1 exited with code 5"), "{}", text(0));
        } else {
            assert_eq!((outs[0].status.code(), outs[1].status.code()), (Some(5), Some(5)), "{}\n{}", text(0), text(1));
        }
    }
}

/// `kill -9` of the launcher takes its ranks with it: each rank writes its pid and sleeps; after
/// the launcher is killed, none of them is alive two seconds later.
#[cfg(target_os = "linux")]
#[test]
fn ranks_die_with_a_killed_launcher() {
    let dir = tempfile::tempdir().unwrap();
    let script = format!("echo $$ > {}/rank.$RANK; exec sleep 60", dir.path().display());
    let mut launcher = Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
        .args(["launch", "--standalone", "--nproc-per-node", "2", "--", "sh", "-c", &script])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let pid_file = |rank: usize| dir.path().join(format!("rank.{rank}"));
    let deadline = Instant::now() + Duration::from_secs(20);
    let pids: Vec<String> = loop {
        let read: Vec<_> =
            (0..2).filter_map(|r| std::fs::read_to_string(pid_file(r)).ok().filter(|p| p.ends_with('\n'))).collect();
        if read.len() == 2 {
            break read.into_iter().map(|p| p.trim().to_string()).collect();
        }
        assert!(Instant::now() < deadline, "the ranks did not start");
        std::thread::sleep(Duration::from_millis(20));
    };
    let alive = |pid: &str| std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| !s.contains(") Z "));
    assert!(pids.iter().all(|p| alive(p)), "ranks {pids:?} should be running");
    launcher.kill().unwrap(); // SIGKILL: the launcher gets no chance to stop them itself
    launcher.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(2);
    while pids.iter().any(|p| alive(p)) && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let orphans: Vec<_> = pids.iter().filter(|p| alive(p)).collect();
    for p in &orphans {
        let _ = Command::new("kill").args(["-9", p]).status();
    }
    assert!(orphans.is_empty(), "ranks {orphans:?} outlived their killed launcher");
}

#[cfg(not(target_os = "linux"))]
#[test]
fn ranks_die_with_a_killed_launcher() {
    eprintln!("SKIPPED: the parent-death signal and /proc are Linux's");
}
