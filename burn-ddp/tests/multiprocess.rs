//! Multi-process tests over loopback TCP: the conformance suite for 2, 3 and 4 ranks, and the
//! faults (dead rank, missing rank, wrong WORLD_SIZE, busy port). Each test re-executes this
//! test binary once per rank (`BURN_DDP_TEST_ROLE=worker`) with a hard time-out.

use burn_ddp::process_group::buffer::DType;
use burn_ddp::process_group::*;
use burn_ddp::{CommBackend, Error, ProcessGroup, ReduceOp, RendezvousConfig, init_process_group};
mod common;

use common::{assert_all_ok, is_worker, spawn};
use std::time::{Duration, Instant};

fn group() -> std::sync::Arc<burn_ddp::Group> {
    init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap()).unwrap()
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// The conformance suite, written once against `&dyn ProcessGroup`. Every rank's data is a
/// known function of (rank, index), so each result is checked exactly.
pub fn conformance(pg: &dyn ProcessGroup) {
    burn_ddp::testing::conformance(pg, &mut burn_ddp::testing::HostMemory);
    let (r, w) = (pg.rank(), pg.world_size());

    // Tensor helpers on a burn backend.
    use burn::prelude::*;
    type B = burn_flex::Flex;
    let device = Default::default();
    let t = Tensor::<B, 2>::from_floats([[r as f32, 1.0], [2.0, -(r as f32)]], &device);
    let sum = burn_ddp::tensor::all_reduce(pg, t, ReduceOp::Sum).unwrap();
    let s = (w * (w - 1) / 2) as f32;
    assert_eq!(sum.into_data().to_vec::<f32>().unwrap(), [s, w as f32, 2.0 * w as f32, -s]);
    let b = burn_ddp::tensor::broadcast(pg, Tensor::<B, 1>::from_floats([r as f32 + 5.0], &device), w - 1).unwrap();
    assert_eq!(b.into_data().to_vec::<f32>().unwrap(), [w as f32 + 4.0]);
    let g = burn_ddp::tensor::all_gather(pg, Tensor::<B, 2>::from_floats([[r as f32, 0.0]], &device)).unwrap();
    assert_eq!(g.dims(), [w, 2]);
}

fn conformance_for(test: &str, world: usize) {
    if is_worker() {
        let pg = group();
        conformance(&*pg);
        println!("rank {} of {world}: conformance ok", pg.rank());
        return;
    }
    let outs = spawn(test, world, &(0..world).collect::<Vec<_>>(), &[]);
    assert_all_ok(test, &outs);
}

#[test]
fn tcp_conformance_2_ranks() {
    conformance_for("tcp_conformance_2_ranks", 2);
}

#[test]
fn tcp_conformance_3_ranks() {
    conformance_for("tcp_conformance_3_ranks", 3);
}

#[test]
fn tcp_conformance_4_ranks() {
    conformance_for("tcp_conformance_4_ranks", 4);
}

#[test]
fn single_rank_group_works_without_peers() {
    if is_worker() {
        conformance(&*group());
        return;
    }
    assert_all_ok("single_rank", &spawn("single_rank_group_works_without_peers", 1, &[0], &[]));
}

/// An all-reduce of `len` ones that must fail within `timeout`: the error (printed, for the
/// parent's checks) and how long it took.
fn failed_all_reduce(pg: &dyn ProcessGroup, len: usize, timeout: Duration) -> (Error, Duration) {
    let mut b = f32_bytes(&vec![1.0; len]);
    let t = Instant::now();
    let err = pg
        .all_reduce(Buffer::host(DType::F32, &mut b), &AllReduceOptions { op: ReduceOp::Sum, timeout: Some(timeout) })
        .unwrap_err();
    println!("ERROR rank {}: {err} after {:?}", pg.rank(), t.elapsed());
    (err, t.elapsed())
}

#[test]
fn dead_rank_mid_collective_is_an_error_not_a_hang() {
    const TEST: &str = "dead_rank_mid_collective_is_an_error_not_a_hang";
    if is_worker() {
        let pg = group();
        if pg.rank() == 2 {
            std::process::exit(3); // dies before the collective
        }
        let (err, took) = failed_all_reduce(&*pg, 100_000, Duration::from_secs(10));
        assert!(took < Duration::from_secs(15));
        if pg.rank() == 0 {
            // Rank 0 receives from rank 2: the dead rank is named.
            assert!(matches!(err, Error::PeerFailed { peer: 2, .. } | Error::Timeout { .. }), "{err}");
            assert!(err.to_string().contains('2'), "{err}");
        }
        return;
    }
    let outs = spawn(TEST, 3, &[0, 1, 2], &[]);
    assert_eq!(outs[2].status.code(), Some(3));
    assert_all_ok(TEST, &outs[..2]);
    assert!(
        String::from_utf8_lossy(&outs[0].stdout).contains("peer rank 2 failed"),
        "{}",
        String::from_utf8_lossy(&outs[0].stdout)
    );
}

#[test]
fn missing_rank_times_out_naming_it() {
    const TEST: &str = "missing_rank_times_out_naming_it";
    if is_worker() {
        let err = init_process_group(CommBackend::Tcp, &RendezvousConfig::from_env().unwrap())
            .err()
            .expect("rendezvous must fail");
        println!("ERROR {err}");
        assert!(matches!(&err, Error::Timeout { missing, .. } if missing == &vec![2]), "{err}");
        return;
    }
    let outs = spawn(TEST, 3, &[0, 1], &[("BURN_DDP_TIMEOUT_S", "3".into())]);
    assert_all_ok(TEST, &outs);
}

#[test]
fn wrong_world_size_is_reported() {
    const TEST: &str = "wrong_world_size_is_reported";
    if is_worker() {
        let mut cfg = RendezvousConfig::from_env().unwrap();
        if cfg.rank == 1 {
            cfg.world_size = 2; // rank 1 believes in a world of two
        }
        let err = init_process_group(CommBackend::Tcp, &cfg).err().expect("rendezvous must fail");
        println!("ERROR rank {}: {err}", cfg.rank);
        if cfg.rank == 1 {
            assert!(err.to_string().contains("WORLD_SIZE=3"), "{err}");
        } else {
            assert!(matches!(err, Error::Timeout { .. }), "{err}");
        }
        return;
    }
    let outs = spawn(TEST, 3, &[0, 1], &[("BURN_DDP_TIMEOUT_S", "3".into())]);
    assert_all_ok(TEST, &outs);
}

#[test]
fn busy_master_port_is_one_clear_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let cfg = RendezvousConfig {
        master_addr: "127.0.0.1".into(),
        master_port: port,
        rank: 0,
        world_size: 2,
        local_rank: 0,
        local_world_size: 2,
        timeout: Duration::from_secs(2),
        token: None,
        source: burn_ddp::launch_env::EnvSource::Torchrun,
    };
    let err = init_process_group(CommBackend::Tcp, &cfg).err().unwrap();
    assert!(matches!(err, Error::PortInUse { .. }), "{err}");
    assert!(err.to_string().contains("already in use"), "{err}");
}

#[test]
fn nccl_without_cuda_or_a_gpu_is_a_one_line_error() {
    #[cfg(not(feature = "cuda"))]
    {
        let store = burn_ddp::store::StoreServer::bind("127.0.0.1", 0, None).unwrap();
        let client =
            burn_ddp::store::TcpStore::connect("127.0.0.1", store.local_addr().port(), None, Duration::from_secs(2))
                .unwrap();
        let err = NcclProcessGroup::new(&client, 0, 1, 0, Duration::from_secs(1)).err().unwrap();
        assert!(matches!(err, Error::CudaNotCompiled));
    }
    #[cfg(feature = "cuda")]
    match burn_ddp::cuda_device_count() {
        Ok(n) if n > 0 => eprintln!(
            "SKIPPED nccl_without_cuda_or_a_gpu_is_a_one_line_error: a CUDA build on a machine with {n} GPU(s)"
        ),
        _ => {
            // A CUDA build on a machine without a driver or GPU: an error naming what is missing.
            let store = burn_ddp::store::StoreServer::bind("127.0.0.1", 0, None).unwrap();
            let client = burn_ddp::store::TcpStore::connect(
                "127.0.0.1",
                store.local_addr().port(),
                None,
                Duration::from_secs(2),
            )
            .unwrap();
            let err = NcclProcessGroup::new(&client, 0, 1, 0, Duration::from_secs(1)).err().unwrap();
            assert!(matches!(err, Error::Cuda { .. }), "{err}");
            assert_eq!(err.to_string().lines().count(), 1, "{err}");
        }
    }
}

/// A rank that is alive but never enters the collective (stuck in its own code): every waiting
/// rank times out naming it — not its ring neighbour, which is waiting too.
#[test]
fn a_stuck_rank_is_named_by_every_rank_that_waits_for_it() {
    const TEST: &str = "a_stuck_rank_is_named_by_every_rank_that_waits_for_it";
    if is_worker() {
        let pg = group();
        if pg.rank() == 1 {
            std::thread::sleep(Duration::from_secs(9)); // stuck, then leaves without the collective
            return;
        }
        let (err, _) = failed_all_reduce(&*pg, 10_000, Duration::from_secs(2));
        assert!(matches!(&err, Error::Timeout { missing, .. } if missing == &vec![1]), "rank {}: {err}", pg.rank());
        return;
    }
    let outs = spawn(TEST, 3, &[0, 1, 2], &[]);
    assert_all_ok(TEST, &outs);
}
