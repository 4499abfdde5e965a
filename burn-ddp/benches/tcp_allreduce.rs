//! Criterion: TCP ring all-reduce on loopback, bytes/s by size, 2 and 4 ranks. Ranks are
//! threads of this process, each with its own sockets (real TCP through the kernel).

use burn_ddp::process_group::buffer::DType;
use burn_ddp::process_group::{AllReduceOptions, Buffer, ProcessGroup, TcpProcessGroup};
use burn_ddp::store::{StoreServer, TcpStore};
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use std::net::{IpAddr, Ipv4Addr};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::time::{Duration, Instant};

/// A worker rank's thread: it gets (bytes, iterations) and answers when done.
type Worker = (Sender<(usize, u64)>, Receiver<()>);

struct Group {
    rank0: TcpProcessGroup,
    workers: Vec<Worker>,
    _server: StoreServer,
}

fn all_reduce(pg: &TcpProcessGroup, buf: &mut [u8]) {
    pg.all_reduce(Buffer::host(DType::F32, buf), &AllReduceOptions::default()).unwrap();
}

fn group(world: usize) -> Group {
    let server = StoreServer::bind("127.0.0.1", 0, None).unwrap();
    let port = server.local_addr().port();
    let t = Duration::from_secs(30);
    let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
    let mut workers = Vec::new();
    for rank in 1..world {
        let (job_tx, job_rx) = channel::<(usize, u64)>();
        let (done_tx, done_rx) = channel();
        std::thread::spawn(move || {
            let store = TcpStore::connect("127.0.0.1", port, None, t).unwrap();
            let pg = TcpProcessGroup::new(&store, ip, rank, world, t).unwrap();
            done_tx.send(()).unwrap();
            while let Ok((bytes, iters)) = job_rx.recv() {
                let mut buf = vec![1u8; bytes];
                for _ in 0..iters {
                    all_reduce(&pg, &mut buf);
                }
                done_tx.send(()).unwrap();
            }
        });
        workers.push((job_tx, done_rx));
    }
    let store = TcpStore::connect("127.0.0.1", port, None, t).unwrap();
    let rank0 = TcpProcessGroup::new(&store, ip, 0, world, t).unwrap();
    for (_, done) in &workers {
        done.recv().unwrap();
    }
    Group { rank0, workers, _server: server }
}

fn bench(c: &mut Criterion) {
    for world in [2usize, 4] {
        let g = group(world);
        let mut grp = c.benchmark_group(format!("tcp_all_reduce_{world}_ranks"));
        grp.sample_size(10).measurement_time(Duration::from_secs(3)).warm_up_time(Duration::from_millis(500));
        for bytes in [4 << 10, 1 << 20, 16 << 20, 64 << 20] {
            grp.throughput(Throughput::Bytes(bytes as u64));
            grp.bench_with_input(BenchmarkId::from_parameter(format!("{}KiB", bytes >> 10)), &bytes, |b, &bytes| {
                let mut buf = vec![1u8; bytes];
                b.iter_custom(|iters| {
                    for (job, _) in &g.workers {
                        job.send((bytes, iters)).unwrap();
                    }
                    let t = Instant::now();
                    for _ in 0..iters {
                        all_reduce(&g.rank0, &mut buf);
                    }
                    let elapsed = t.elapsed();
                    for (_, done) in &g.workers {
                        done.recv().unwrap();
                    }
                    elapsed
                });
            });
        }
        grp.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
