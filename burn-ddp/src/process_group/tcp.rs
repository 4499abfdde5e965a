//! The TCP process group: a ring of sockets between ranks, ring all-reduce (reduce-scatter then
//! all-gather) with each step's send on a scoped thread so large buffers stream both ways at
//! once. Every transfer carries (sequence, collective, dtype, bytes) so a desynchronised or
//! mismatched peer is reported instead of corrupting data.

use super::buffer::{Buffer, MemoryKind, ReduceOp};
use super::reduce::{accumulate, finish};
use super::{AllGatherOptions, AllReduceOptions, BarrierOptions, BroadcastOptions, ProcessGroup, ReduceScatterOptions};
use crate::error::{Error, Result};
use crate::store::client::Store;
use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

const HEADER: usize = 8 + 1 + 1 + 8;
/// Broadcast forwards in pieces of this size, so the chain is pipelined.
const BROADCAST_PIECE: usize = 4 << 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
enum Kind {
    AllReduce = 1,
    Broadcast = 2,
    AllGather = 3,
    ReduceScatter = 4,
    Barrier = 5,
}

struct Links {
    next: TcpStream,
    prev: TcpStream,
}

/// A process group over TCP sockets (host memory).
pub struct TcpProcessGroup {
    rank: usize,
    world: usize,
    links: Option<Mutex<Links>>,
    seq: AtomicU64,
    timeout: Duration,
    /// Collectives entered so far (the same count on every rank that is not stuck).
    collectives: AtomicU64,
    /// The rendezvous store, to find out after a time-out which ranks never entered the
    /// collective ([`TcpProcessGroup::with_hang_check`]).
    store: Option<std::sync::Arc<dyn Store>>,
}

/// How long a rank that timed out waits for the others to say they are waiting too.
const HANG_GRACE: Duration = Duration::from_secs(3);

fn split(len: usize, parts: usize, i: usize) -> Range<usize> {
    let base = len / parts;
    let extra = len % parts;
    let start = i * base + i.min(extra);
    start..start + base + usize::from(i < extra)
}

impl TcpProcessGroup {
    /// Connects the ring: listens on `ip` (the interface that reaches the store), publishes the
    /// address in the store, connects to rank+1 and accepts rank−1.
    ///
    /// # Errors
    /// Time-outs naming the rank that never appeared, socket errors.
    pub fn new(store: &dyn Store, ip: IpAddr, rank: usize, world: usize, timeout: Duration) -> Result<Self> {
        assert!(rank < world, "Got rank={rank}, expected < world_size={world}");
        if world == 1 {
            return Ok(Self {
                rank,
                world,
                links: None,
                seq: AtomicU64::new(0),
                timeout,
                collectives: AtomicU64::new(0),
                store: None,
            });
        }
        let listener =
            TcpListener::bind((ip, 0)).map_err(|e| Error::io(format!("rank {rank}: listening on {ip}"), e))?;
        let addr = listener.local_addr().map_err(|e| Error::io("listener address", e))?;
        // The port is open to anyone; only a peer that read this rank's nonce from the store
        // (which is itself token-protected) gets in.
        let nonce = ring_nonce(rank);
        store.set(&format!("tcp/addr/{rank}"), format!("{addr} {nonce:016x}").as_bytes())?;
        let next_rank = (rank + 1) % world;
        let prev_rank = (rank + world - 1) % world;
        let next_key = format!("tcp/addr/{next_rank}");
        store.wait(&[&next_key], timeout).map_err(|_| Error::Timeout {
            op: "tcp ring setup".into(),
            rank,
            waited: timeout,
            missing: vec![next_rank],
        })?;
        let published = String::from_utf8_lossy(&store.get(&next_key)?).into_owned();
        let bad = || Error::Store { reason: format!("bad address published by rank {next_rank}: `{published}`") };
        let (next_addr, next_nonce) = published.split_once(' ').ok_or_else(bad)?;
        let next_addr: SocketAddr = next_addr.parse().map_err(|_| bad())?;
        let next_nonce = u64::from_str_radix(next_nonce, 16).map_err(|_| bad())?;
        let mut next = TcpStream::connect_timeout(&next_addr, timeout)
            .map_err(|e| Error::io(format!("rank {rank}: connecting to rank {next_rank} at {next_addr}"), e))?;
        let mut hello = [0u8; 16];
        hello[..8].copy_from_slice(&(rank as u64).to_le_bytes());
        hello[8..].copy_from_slice(&next_nonce.to_le_bytes());
        next.write_all(&hello).map_err(|e| Error::io("ring greeting", e))?;
        let prev = accept_from(&listener, (prev_rank, nonce), rank, timeout)?;
        for s in [&next, &prev] {
            s.set_nodelay(true).map_err(|e| Error::io("socket options", e))?;
        }
        Ok(Self {
            rank,
            world,
            links: Some(Mutex::new(Links { next, prev })),
            seq: AtomicU64::new(0),
            timeout,
            collectives: AtomicU64::new(0),
            store: None,
        })
    }

    fn next_prev(&self) -> usize {
        (self.rank + self.world - 1) % self.world
    }

    fn next_rank(&self) -> usize {
        (self.rank + 1) % self.world
    }

    /// After a time-out, names the ranks that are not stuck here: with the store, every rank
    /// that timed out in this collective leaves a mark and looks for the others' for
    /// [`HANG_GRACE`]; a rank without a mark never entered the collective (it hangs in its own
    /// code, or is stuck in an earlier one). Without the store, or when every rank is waiting
    /// (a lost link), the ring neighbour this rank waited for.
    pub fn with_hang_check(mut self, store: std::sync::Arc<dyn Store>) -> Self {
        self.store = Some(store);
        self
    }

    fn not_here(&self, neighbour: usize) -> Vec<usize> {
        let Some(store) = &self.store else { return vec![neighbour] };
        let collective = self.collectives.load(Ordering::Relaxed);
        let keys: Vec<String> = (0..self.world).map(|r| format!("burn-ddp/tcp-hang/{collective}/{r}")).collect();
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        if store.set(refs[self.rank], b"1").is_err() {
            return vec![neighbour];
        }
        let deadline = Instant::now() + HANG_GRACE;
        loop {
            let Ok(here) = store.check(&refs) else { return vec![neighbour] };
            let absent: Vec<usize> = (0..self.world).filter(|&r| !here[r]).collect();
            if absent.is_empty() {
                return vec![neighbour];
            }
            if Instant::now() >= deadline {
                return absent;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    fn link_error(&self, op: Kind, peer: usize, e: io::Error, waited: Duration) -> Error {
        match e.kind() {
            io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut => {
                Error::Timeout { op: format!("{op:?}"), rank: self.rank, waited, missing: self.not_here(peer) }
            }
            _ => Error::PeerFailed { op: format!("{op:?}"), peer, reason: e.to_string() },
        }
    }

    /// Sends `out` to the next rank while receiving the same-sized message from the previous one
    /// into `into`.
    fn exchange(
        &self,
        links: &mut Links,
        kind: Kind,
        dtype: u8,
        out: &[u8],
        into: &mut Vec<u8>,
        expect_len: usize,
    ) -> Result<()> {
        let seq = self.seq.fetch_add(1, Ordering::Relaxed);
        let started = Instant::now();
        let Links { next, prev } = links;
        let send = |next: &mut TcpStream| -> io::Result<()> {
            let mut header = [0u8; HEADER];
            header[..8].copy_from_slice(&seq.to_le_bytes());
            header[8] = kind as u8;
            header[9] = dtype;
            header[10..].copy_from_slice(&(out.len() as u64).to_le_bytes());
            next.write_all(&header)?;
            next.write_all(out)
        };
        let (sent, received) = std::thread::scope(|s| {
            let h = s.spawn(|| send(next));
            let r = self.receive(prev, seq, kind, dtype, into, expect_len, started);
            (h.join().expect("send thread panicked"), r)
        });
        received?;
        sent.map_err(|e| self.link_error(kind, self.next_rank(), e, started.elapsed()))
    }

    #[allow(clippy::too_many_arguments)]
    fn receive(
        &self,
        prev: &mut TcpStream,
        seq: u64,
        kind: Kind,
        dtype: u8,
        into: &mut Vec<u8>,
        expect_len: usize,
        started: Instant,
    ) -> Result<()> {
        let peer = self.next_prev();
        let mut header = [0u8; HEADER];
        prev.read_exact(&mut header).map_err(|e| self.link_error(kind, peer, e, started.elapsed()))?;
        let their_seq = u64::from_le_bytes(header[..8].try_into().unwrap());
        let len = u64::from_le_bytes(header[10..].try_into().unwrap()) as usize;
        if their_seq != seq || header[8] != kind as u8 || header[9] != dtype || len != expect_len {
            return Err(Error::Mismatch {
                op: format!("{kind:?} #{seq}"),
                rank: peer,
                got: len,
                expected: expect_len,
                dtype: format!("code {} (collective {} #{their_seq}, ours {kind:?} #{seq})", header[9], header[8]),
            });
        }
        into.resize(len, 0);
        prev.read_exact(into).map_err(|e| self.link_error(kind, peer, e, started.elapsed()))
    }

    fn lock(&self, timeout: Option<Duration>) -> Result<std::sync::MutexGuard<'_, Links>> {
        let links = self.links.as_ref().expect("world > 1 has links").lock().expect("tcp links poisoned");
        self.collectives.fetch_add(1, Ordering::Relaxed);
        let t = Some(timeout.unwrap_or(self.timeout));
        for s in [&links.next, &links.prev] {
            s.set_read_timeout(t).and_then(|_| s.set_write_timeout(t)).map_err(|e| Error::io("socket time-out", e))?;
        }
        Ok(links)
    }

    /// One pass around the ring over `buf` split into `world` segments: at step s this rank
    /// sends segment `first_send − s` to the next rank and `combine`s the segment it receives
    /// (`first_send − s − 1`) from the previous one.
    #[allow(clippy::too_many_arguments)]
    fn ring_pass(
        &self,
        links: &mut Links,
        kind: Kind,
        dtype: crate::process_group::buffer::DType,
        buf: &mut [u8],
        first_send: usize,
        combine: impl Fn(&mut [u8], &[u8]),
    ) -> Result<()> {
        let (w, es) = (self.world, dtype.size());
        let n = buf.len() / es;
        let seg = |i: usize| {
            let r = split(n, w, i % w);
            r.start * es..r.end * es
        };
        let mut tmp = Vec::new();
        for s in 0..w - 1 {
            let send_i = first_send + w * 2 - s;
            let (send_r, recv_r) = (seg(send_i), seg(send_i + w - 1));
            self.exchange(links, kind, dtype.code(), &buf[send_r], &mut tmp, recv_r.len())?;
            combine(&mut buf[recv_r], &tmp);
        }
        Ok(())
    }

    /// Ring reduce-scatter: afterwards this rank holds the reduced segment
    /// `(rank + 1 + shift) mod world`.
    fn ring_reduce_scatter(
        &self,
        links: &mut Links,
        kind: Kind,
        dtype: crate::process_group::buffer::DType,
        op: ReduceOp,
        buf: &mut [u8],
        shift: usize,
    ) -> Result<()> {
        self.ring_pass(links, kind, dtype, buf, self.rank + shift, |acc, other| accumulate(dtype, op, acc, other))
    }

    /// Ring all-gather: this rank starts holding segment `(rank + 1 + shift) mod world`.
    fn ring_all_gather(
        &self,
        links: &mut Links,
        kind: Kind,
        dtype: crate::process_group::buffer::DType,
        buf: &mut [u8],
        shift: usize,
    ) -> Result<()> {
        self.ring_pass(links, kind, dtype, buf, self.rank + 1 + shift, |dst, src| dst.copy_from_slice(src))
    }
}

/// A per-process secret for the ring's greeting (not cryptographic: the store's token is the
/// access control; this keeps connections that did not go through the store out of the ring).
fn ring_nonce(rank: usize) -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_usize(rank);
    h.write_u128(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos()));
    h.write_u32(std::process::id());
    h.finish()
}

/// Accepts the previous rank: a connection that does not greet with (`expected` rank, this
/// rank's nonce) is refused and logged, and the wait goes on until `timeout`.
fn accept_from(
    listener: &TcpListener,
    (expected, nonce): (usize, u64),
    rank: usize,
    timeout: Duration,
) -> Result<TcpStream> {
    listener.set_nonblocking(true).map_err(|e| Error::io("listener", e))?;
    let start = Instant::now();
    loop {
        match listener.accept() {
            Ok((mut s, peer)) => {
                s.set_nonblocking(false)
                    .and_then(|_| s.set_read_timeout(Some(timeout.min(Duration::from_secs(10)))))
                    .map_err(|e| Error::io("accepted socket", e))?;
                let mut hello = [0u8; 16];
                let greeting = s.read_exact(&mut hello).map(|()| {
                    (
                        u64::from_le_bytes(hello[..8].try_into().expect("8 bytes")) as usize,
                        u64::from_le_bytes(hello[8..].try_into().expect("8 bytes")),
                    )
                });
                match greeting {
                    Ok((from, n)) if from == expected && n == nonce => {
                        s.set_read_timeout(Some(timeout)).map_err(|e| Error::io("accepted socket", e))?;
                        return Ok(s);
                    }
                    Ok((from, _)) => log::warn!(
                        "rank {rank}: refused a ring connection from {peer} (claimed rank {from}, expected rank {expected} with this job's ring nonce)"
                    ),
                    Err(e) => log::warn!("rank {rank}: refused a ring connection from {peer}: no greeting ({e})"),
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) => return Err(Error::io("accepting", e)),
        }
        if start.elapsed() > timeout {
            return Err(Error::Timeout {
                op: "tcp ring setup".into(),
                rank,
                waited: start.elapsed(),
                missing: vec![expected],
            });
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl ProcessGroup for TcpProcessGroup {
    fn rank(&self) -> usize {
        self.rank
    }
    fn world_size(&self) -> usize {
        self.world
    }
    fn backend(&self) -> &'static str {
        "tcp"
    }
    fn memory(&self) -> MemoryKind {
        MemoryKind::Host
    }

    fn all_reduce(&self, mut buf: Buffer<'_>, opts: &AllReduceOptions) -> Result<()> {
        let dtype = buf.dtype;
        let bytes = buf.host_bytes("tcp")?;
        if self.world > 1 {
            let mut links = self.lock(opts.timeout)?;
            self.ring_reduce_scatter(&mut links, Kind::AllReduce, dtype, opts.op, bytes, 0)?;
            self.ring_all_gather(&mut links, Kind::AllReduce, dtype, bytes, 0)?;
        }
        finish(dtype, opts.op, bytes, self.world);
        Ok(())
    }

    fn broadcast(&self, mut buf: Buffer<'_>, opts: &BroadcastOptions) -> Result<()> {
        assert!(opts.root < self.world, "Got root={}, expected < world_size={}", opts.root, self.world);
        let dtype = buf.dtype.code();
        let bytes = buf.host_bytes("tcp")?;
        if self.world == 1 {
            return Ok(());
        }
        let mut links = self.lock(opts.timeout)?;
        let last = (opts.root + self.world - 1) % self.world;
        let pieces: Vec<Range<usize>> = (0..bytes.len().div_ceil(BROADCAST_PIECE).max(1))
            .map(|i| i * BROADCAST_PIECE..((i + 1) * BROADCAST_PIECE).min(bytes.len()))
            .collect();
        for r in pieces {
            let seq = self.seq.fetch_add(1, Ordering::Relaxed);
            let started = Instant::now();
            if self.rank != opts.root {
                let mut tmp = Vec::new();
                let Links { prev, .. } = &mut *links;
                self.receive(prev, seq, Kind::Broadcast, dtype, &mut tmp, r.len(), started)?;
                bytes[r.clone()].copy_from_slice(&tmp);
            }
            if self.rank != last {
                let mut header = [0u8; HEADER];
                header[..8].copy_from_slice(&seq.to_le_bytes());
                header[8] = Kind::Broadcast as u8;
                header[9] = dtype;
                header[10..].copy_from_slice(&(r.len() as u64).to_le_bytes());
                let next = &mut links.next;
                next.write_all(&header)
                    .and_then(|_| next.write_all(&bytes[r]))
                    .map_err(|e| self.link_error(Kind::Broadcast, self.next_rank(), e, started.elapsed()))?;
            }
        }
        Ok(())
    }

    fn all_gather(&self, mut input: Buffer<'_>, mut output: Buffer<'_>, opts: &AllGatherOptions) -> Result<()> {
        assert!(
            input.dtype == output.dtype && output.len == input.len * self.world,
            "Got all_gather input {} × {:?} and output {} × {:?}; expected output = world_size ({}) × input",
            input.len,
            input.dtype,
            output.len,
            output.dtype,
            self.world
        );
        let dtype = input.dtype;
        let n = input.host_bytes("tcp")?.len();
        let own = input.host_bytes("tcp")?.to_vec();
        let out = output.host_bytes("tcp")?;
        out[self.rank * n..(self.rank + 1) * n].copy_from_slice(&own);
        if self.world > 1 {
            let mut links = self.lock(opts.timeout)?;
            // Segments of `out` are exactly the ranks' blocks; this rank starts with its own.
            self.ring_all_gather(&mut links, Kind::AllGather, dtype, out, self.world - 1)?;
        }
        Ok(())
    }

    fn reduce_scatter(&self, mut input: Buffer<'_>, mut output: Buffer<'_>, opts: &ReduceScatterOptions) -> Result<()> {
        assert!(
            input.dtype == output.dtype && input.len == output.len * self.world,
            "Got reduce_scatter input {} × {:?} and output {} × {:?}; expected input = world_size ({}) × output",
            input.len,
            input.dtype,
            output.len,
            output.dtype,
            self.world
        );
        let dtype = input.dtype;
        let mut work = input.host_bytes("tcp")?.to_vec();
        if self.world > 1 {
            let mut links = self.lock(opts.timeout)?;
            self.ring_reduce_scatter(&mut links, Kind::ReduceScatter, dtype, opts.op, &mut work, self.world - 1)?;
        }
        let n = output.len * dtype.size();
        let out = output.host_bytes("tcp")?;
        out.copy_from_slice(&work[self.rank * n..(self.rank + 1) * n]);
        finish(dtype, opts.op, out, self.world);
        Ok(())
    }

    fn barrier(&self, opts: &BarrierOptions) -> Result<()> {
        if self.world == 1 {
            return Ok(());
        }
        let mut token = 1i64.to_le_bytes();
        let mut links = self.lock(opts.timeout)?;
        self.ring_reduce_scatter(
            &mut links,
            Kind::Barrier,
            crate::process_group::buffer::DType::I64,
            ReduceOp::Sum,
            &mut token,
            0,
        )?;
        self.ring_all_gather(&mut links, Kind::Barrier, crate::process_group::buffer::DType::I64, &mut token, 0)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn split_covers_every_element_once() {
        for len in [0, 1, 5, 7, 100] {
            for parts in 1..6 {
                let ranges: Vec<_> = (0..parts).map(|i| split(len, parts, i)).collect();
                assert_eq!(ranges[0].start, 0);
                assert_eq!(ranges[parts - 1].end, len);
                assert!(ranges.windows(2).all(|w| w[0].end == w[1].start));
            }
        }
    }

    /// A stranger who connects to rank 0's ring port first (greeting as rank 1, without the
    /// nonce) is refused; the real rank 1 still joins and the ring reduces.
    #[test]
    fn a_stranger_on_the_ring_port_is_refused_and_the_ring_still_forms() {
        use super::{ProcessGroup, TcpProcessGroup};
        use crate::process_group::{AllReduceOptions, Buffer, DType};
        use crate::store::{Store, StoreServer, TcpStore};
        use std::io::Write;
        use std::time::Duration;
        let t = Duration::from_secs(10);
        let server = StoreServer::bind("127.0.0.1", 0, None).unwrap();
        let port = server.local_addr().port();
        let rank0 = std::thread::spawn(move || {
            let store = TcpStore::connect("127.0.0.1", port, None, t).unwrap();
            TcpProcessGroup::new(&store, "127.0.0.1".parse().unwrap(), 0, 2, t).unwrap()
        });
        let store = TcpStore::connect("127.0.0.1", port, None, t).unwrap();
        store.wait(&["tcp/addr/0"], t).unwrap();
        let published = String::from_utf8(store.get("tcp/addr/0").unwrap()).unwrap();
        let addr = published.split(' ').next().unwrap();
        let mut stranger = std::net::TcpStream::connect(addr).unwrap();
        stranger.write_all(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap();
        let rank1 = TcpProcessGroup::new(&store, "127.0.0.1".parse().unwrap(), 1, 2, t).unwrap();
        let rank0 = rank0.join().unwrap();
        let reduce = |pg: TcpProcessGroup, v: f32| {
            std::thread::spawn(move || {
                let mut bytes = v.to_le_bytes().to_vec();
                pg.all_reduce(Buffer::host(DType::F32, &mut bytes), &AllReduceOptions::default()).unwrap();
                f32::from_le_bytes(bytes.try_into().unwrap())
            })
        };
        let (a, b) = (reduce(rank0, 1.5), reduce(rank1, 2.0));
        assert_eq!((a.join().unwrap(), b.join().unwrap()), (3.5, 3.5));
        drop(server);
    }
}
