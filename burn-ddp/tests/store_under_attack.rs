//! Rank 0's store under a flood of strangers, in a real two-rank CPU run: two ranks under
//! `burn-ddp launch` (this test binary's worker mode) all-reduce over their TCP group, each sum
//! checked, while 10,000 connections that send garbage, announce 64 MiB frames, send nothing
//! or a greeting cut short reach the store's port. The run finishes, rank 0's peak memory stays
//! within 50 MiB of an undisturbed run's, and its thread count stays bounded.

#[cfg(target_os = "linux")]
mod linux {
    use burn_ddp::ProcessGroup;
    use std::io::Write;
    use std::net::TcpStream;
    use std::process::{Command, Stdio};
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::{Duration, Instant};

    const STRANGERS: usize = 10_000;
    const WAVE: usize = 200;

    /// The process id of `parent`'s child whose environment says `RANK=0`.
    fn rank0_pid(parent: u32) -> Option<u32> {
        for entry in std::fs::read_dir("/proc").ok()?.flatten() {
            let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else { continue };
            let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else { continue };
            let ppid =
                stat.rsplit(')').next().and_then(|s| s.split_whitespace().nth(1)).and_then(|p| p.parse::<u32>().ok());
            if ppid == Some(parent)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .unwrap_or_default()
                    .split(|&b| b == 0)
                    .any(|kv| kv == b"RANK=0")
            {
                return Some(pid);
            }
        }
        None
    }

    /// `(VmHWM in KiB, Threads)` of `pid`, while it lives.
    fn usage(pid: u32) -> Option<(u64, u64)> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |name: &str| {
            status.lines().find_map(|l| l.strip_prefix(name)).and_then(|v| v.split_whitespace().next()?.parse().ok())
        };
        Some((field("VmHWM:")?, field("Threads:")?))
    }

    /// One wave of strangers: garbage, 64 MiB frame announcements, silence, a greeting cut short.
    /// Returns how many connected.
    fn wave(port: u16) -> usize {
        let mut held = Vec::new();
        for i in 0..WAVE {
            let Ok(mut c) = TcpStream::connect(("127.0.0.1", port)) else { continue };
            let _ = match i % 4 {
                0 => c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"),
                1 => c.write_all(&(64u32 << 20).to_le_bytes()).and_then(|()| c.write_all(&[7u8; 4096])),
                2 => Ok(()),
                _ => c.write_all(&100u32.to_le_bytes()).and_then(|()| c.write_all(&[1, 1, 0])),
            };
            held.push(c);
        }
        std::thread::sleep(Duration::from_millis(20));
        held.len()
    }

    struct Run {
        peak_kib: u64,
        max_threads: u64,
        stdout: String,
        strangers: usize,
    }

    /// Two ranks all-reducing until told to stop; with `attack`, strangers flood rank 0's store
    /// first, else the ranks run undisturbed for as long.
    fn run(attack: bool) -> Run {
        let port = burn_ddp::launch::free_port().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let stop = dir.path().join("stop");
        let mut launcher = Command::new(env!("CARGO_BIN_EXE_burn-ddp"))
            .args(["launch", "--nproc-per-node", "2", "--master-port", &port.to_string(), "--"])
            .arg(std::env::current_exe().unwrap())
            .args(["linux::all_reduce_worker", "--exact", "--ignored", "--nocapture"])
            .env("STOP_FILE", &stop)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let rank0 = loop {
            if let Some(pid) = rank0_pid(launcher.id()) {
                break pid;
            }
            assert!(Instant::now() < deadline, "rank 0 did not start");
            std::thread::sleep(Duration::from_millis(10));
        };
        let (done, sent) = (Arc::new(AtomicBool::new(false)), Arc::new(AtomicUsize::new(0)));
        let source = {
            let (done, sent) = (done.clone(), sent.clone());
            std::thread::spawn(move || {
                let started = Instant::now();
                while attack && sent.load(Ordering::SeqCst) < STRANGERS {
                    sent.fetch_add(wave(port), Ordering::SeqCst);
                }
                while !attack && started.elapsed() < Duration::from_secs(3) {
                    std::thread::sleep(Duration::from_millis(10));
                }
                std::fs::write(&stop, b"").unwrap();
                done.store(true, Ordering::SeqCst);
            })
        };
        let (mut peak_kib, mut max_threads) = (0, 0);
        while let Some((hwm, threads)) = usage(rank0) {
            (peak_kib, max_threads) = (peak_kib.max(hwm), max_threads.max(threads));
            if launcher.try_wait().unwrap().is_some() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        let out = launcher.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        assert!(done.load(Ordering::SeqCst), "the ranks ended before they were told to stop:\n{stdout}");
        source.join().unwrap();
        assert!(out.status.success(), "the run failed (attacked: {attack}):\n{stdout}");
        Run { peak_kib, max_threads, stdout, strangers: sent.load(Ordering::SeqCst) }
    }

    #[test]
    #[ignore = "worker of ten_thousand_strangers_cost_rank_0_little_and_the_run_finishes: runs only under the launcher"]
    fn all_reduce_worker() {
        let config = burn_ddp::RendezvousConfig::from_env().unwrap();
        let pg = burn_ddp::init_process_group(burn_ddp::CommBackend::Tcp, &config).unwrap();
        let stop = std::path::PathBuf::from(std::env::var_os("STOP_FILE").unwrap());
        let mut rounds = 0;
        loop {
            let mut v = vec![pg.rank() as f64 + 1.0; 1 << 16];
            v[0] = f64::from(u8::from(pg.rank() == 0 && stop.exists()));
            burn_ddp::tensor::all_reduce_f64(&*pg, &mut v, burn_ddp::ReduceOp::Sum).unwrap();
            assert!(v[1..].iter().all(|&x| x == 3.0), "a wrong sum in round {rounds}");
            rounds += 1;
            if v[0] > 0.0 {
                break;
            }
            std::thread::sleep(Duration::from_millis(2));
        }
        println!("RESULT rank={} rounds={rounds}", pg.rank());
    }

    fn rounds(stdout: &str) -> Vec<String> {
        stdout
            .lines()
            .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("rounds=")).map(String::from))
            .collect()
    }

    #[test]
    fn ten_thousand_strangers_cost_rank_0_little_and_the_run_finishes() {
        let quiet = run(false);
        let attacked = run(true);
        // Waves stop once this many connected; a wave whose connections the backlog refused in
        // part makes the last one overshoot.
        assert!(attacked.strangers >= STRANGERS, "only {} strangers connected", attacked.strangers);
        for r in [&quiet, &attacked] {
            let n = rounds(&r.stdout);
            assert!(n.len() == 2 && n[0] == n[1], "both ranks must finish the same rounds:\n{}", r.stdout);
        }
        let extra_mib = attacked.peak_kib.saturating_sub(quiet.peak_kib) as f64 / 1024.0;
        assert!(
            extra_mib <= 50.0,
            "rank 0's peak memory grew by {extra_mib:.1} MiB ({} vs {} KiB)",
            attacked.peak_kib,
            quiet.peak_kib
        );
        // At most MAX_PENDING threads wait for a greeting; beside them, the threads of refused
        // strangers that have handed their slot back but not yet exited, which only the
        // scheduler bounds (on 2 busy cores up to ~45 were seen at once), and the accept and
        // authenticated threads. 10,000 strangers with a thread each would be far above this.
        let bound = quiet.max_threads + 2 * burn_ddp::store::admission::MAX_PENDING as u64 + 16;
        assert!(
            attacked.max_threads <= bound,
            "rank 0 ran {} threads (undisturbed: {}, bound {bound})",
            attacked.max_threads,
            quiet.max_threads
        );
        eprintln!(
            "rank 0 under 10,000 strangers: peak {} KiB (undisturbed {} KiB), at most {} threads (undisturbed {})",
            attacked.peak_kib, quiet.peak_kib, attacked.max_threads, quiet.max_threads
        );
    }
}

#[cfg(not(target_os = "linux"))]
#[test]
fn ten_thousand_strangers_cost_rank_0_little_and_the_run_finishes() {
    eprintln!("SKIPPED: rank 0's memory and threads are read from Linux's /proc");
}
