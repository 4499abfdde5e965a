//! Who the store lets in, and what a stranger may cost it: a connection is *pending* until its
//! greeting carries the right token, pending connections are few (the oldest is closed when a
//! new one would pass the cap) and short-lived, authenticated ones are capped too, and refused
//! peers are logged once per address with a running count.

use std::collections::{HashMap, VecDeque};
use std::io::{self, Read};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Most connections waiting for their greeting at once. A rank greets within milliseconds of
/// connecting, so evicting the oldest when a new one arrives costs a stalled stranger its slot,
/// never a rank its rendezvous.
pub const MAX_PENDING: usize = 64;
/// Most authenticated connections at once (a rank holds one or two).
pub const MAX_OPEN: usize = 4096;
/// How long a connection may take to send its greeting.
pub const GREETING_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest greeting frame: the version and a token.
pub const MAX_GREETING: usize = 8 << 10;

/// The server's book of connections.
#[derive(Default)]
pub struct Admission {
    pending: Mutex<PendingBook>,
    room: Condvar,
    next_id: AtomicU64,
    open: AtomicUsize,
    refused: Mutex<HashMap<IpAddr, u64>>,
}

/// Connections waiting for their greeting: the sockets not yet evicted, oldest first, and the
/// threads still serving pending connections (an evicted one's thread ends at once).
#[derive(Default)]
struct PendingBook {
    queue: VecDeque<(u64, TcpStream)>,
    live: usize,
}

/// A pending connection's place in the book; dropping it (its thread ending, or the greeting
/// accepted) frees the place.
pub struct Pending {
    book: Arc<Admission>,
    id: u64,
}

/// An authenticated connection's place; dropping it frees the slot.
pub struct Open<'a>(&'a Admission);

impl Admission {
    /// Books `conn` as pending, on the accepting thread. When [`MAX_PENDING`] wait already,
    /// the oldest is shut down (its thread then ends at once) and counted as refused, and this
    /// returns only when fewer than [`MAX_PENDING`] pending threads live: strangers wait, not
    /// the server's memory.
    pub fn admit(self: &Arc<Self>, conn: &TcpStream) -> io::Result<Pending> {
        let (id, clone) = (self.next_id.fetch_add(1, Ordering::Relaxed), conn.try_clone()?);
        let mut book = self.pending.lock().expect("store admission poisoned");
        let evicted = (book.queue.len() >= MAX_PENDING).then(|| book.queue.pop_front()).flatten();
        if let Some((_, old)) = evicted {
            let _ = old.shutdown(Shutdown::Both);
            if let Ok(peer) = old.peer_addr() {
                self.refuse(peer.ip(), "no greeting before newer connections needed its slot");
            }
        }
        while book.live >= MAX_PENDING {
            book = self.room.wait(book).expect("store admission poisoned");
        }
        book.queue.push_back((id, clone));
        book.live += 1;
        Ok(Pending { book: self.clone(), id })
    }

    /// Moves a greeted connection from pending to open, or `None` when [`MAX_OPEN`] are open.
    pub fn authenticated(&self, pending: Pending) -> Option<Open<'_>> {
        drop(pending);
        if self.open.fetch_add(1, Ordering::SeqCst) >= MAX_OPEN {
            self.open.fetch_sub(1, Ordering::SeqCst);
            return None;
        }
        Some(Open(self))
    }

    /// Counts a refused connection from `ip`; logs the first and every tenfold count after it.
    pub fn refuse(&self, ip: IpAddr, reason: &str) {
        let count = {
            let mut refused = self.refused.lock().expect("store admission poisoned");
            let n = refused.entry(ip).or_insert(0);
            *n += 1;
            *n
        };
        if count == 1 {
            log::warn!(
                "store: refused a connection from {ip}: {reason} (further refusals of this address are counted)"
            );
        } else if is_power_of_ten(count) {
            log::warn!("store: {count} connections from {ip} refused so far (latest: {reason})");
        }
    }

    /// Refusals so far, by address.
    pub fn refusals(&self) -> HashMap<IpAddr, u64> {
        self.refused.lock().expect("store admission poisoned").clone()
    }

    /// Threads serving connections that wait for their greeting now.
    pub fn pending(&self) -> usize {
        self.pending.lock().expect("store admission poisoned").live
    }
}

fn is_power_of_ten(mut n: u64) -> bool {
    while n >= 10 && n.is_multiple_of(10) {
        n /= 10;
    }
    n == 1
}

impl Drop for Pending {
    fn drop(&mut self) {
        let mut book = self.book.pending.lock().expect("store admission poisoned");
        book.queue.retain(|(id, _)| *id != self.id);
        book.live -= 1;
        self.book.room.notify_one();
    }
}

impl Drop for Open<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

/// A socket read with one deadline for the whole message (a read time-out alone restarts with
/// every byte, so a peer trickling bytes would hold its slot for ever).
pub struct Deadline<'a> {
    conn: &'a TcpStream,
    until: Instant,
}

impl<'a> Deadline<'a> {
    /// Reads from `conn` until `within` from now.
    pub fn new(conn: &'a TcpStream, within: Duration) -> Self {
        Self { conn, until: Instant::now() + within }
    }
}

impl Read for Deadline<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::Error::new(io::ErrorKind::TimedOut, "no greeting in time"));
        }
        self.conn.set_read_timeout(Some(left))?;
        let mut conn = self.conn;
        conn.read(buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::TcpListener;

    fn pair(listener: &TcpListener) -> (TcpStream, TcpStream) {
        let client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (listener.accept().unwrap().0, client)
    }

    #[test]
    fn the_oldest_pending_connection_gives_way_and_is_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let book = Arc::new(Admission::default());
        let conns: Vec<_> = (0..MAX_PENDING + 1).map(|_| pair(&listener)).collect();
        let mut tickets: VecDeque<Pending> = conns[..MAX_PENDING].iter().map(|(s, _)| book.admit(s).unwrap()).collect();
        assert_eq!(book.pending(), MAX_PENDING);
        // One more: the oldest is shut down, and the newcomer waits until its thread ends.
        let (book2, newest) = (book.clone(), conns[MAX_PENDING].0.try_clone().unwrap());
        let late = std::thread::spawn(move || book2.admit(&newest).unwrap());
        let mut oldest = &conns[0].1;
        oldest.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        assert_eq!(oldest.read(&mut [0u8; 1]).unwrap(), 0, "the oldest was not shut down");
        std::thread::sleep(Duration::from_millis(50));
        assert!(!late.is_finished(), "the newcomer must wait for a pending thread to end");
        drop(tickets.pop_front()); // the evicted connection's thread ends
        tickets.push_back(late.join().unwrap());
        assert_eq!(book.pending(), MAX_PENDING);
        assert_eq!(book.refusals().values().sum::<u64>(), 1);
        let open = book.authenticated(tickets.pop_back().unwrap()).expect("a slot is free");
        assert_eq!(book.pending(), MAX_PENDING - 1);
        drop(open);
        drop(tickets);
        assert_eq!(book.pending(), 0);
    }

    #[test]
    fn a_trickling_peer_runs_into_the_deadline() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (server_side, mut client) = pair(&listener);
        let writer = std::thread::spawn(move || {
            for _ in 0..20 {
                if std::io::Write::write_all(&mut client, &[0]).is_err() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let start = Instant::now();
        let mut buf = [0u8; 64];
        let err = Deadline::new(&server_side, Duration::from_millis(300)).read_exact(&mut buf).unwrap_err();
        assert!(matches!(err.kind(), io::ErrorKind::TimedOut | io::ErrorKind::WouldBlock), "{err}");
        assert!(start.elapsed() < Duration::from_millis(900), "{:?}", start.elapsed());
        drop(server_side);
        writer.join().unwrap();
    }

    #[test]
    fn refusals_are_logged_at_tenfold_counts() {
        assert!([1, 10, 100, 1000].iter().all(|&n| is_power_of_ten(n)));
        assert!([0, 2, 11, 20, 110].iter().all(|&n| !is_power_of_ten(n)));
    }
}
