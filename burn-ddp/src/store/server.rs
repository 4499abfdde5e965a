//! The store server, run by rank 0: one thread per connection, a shared map, condition-variable
//! waits. A malformed, oversized or unauthenticated connection is closed; the server keeps
//! serving. What a stranger may hold before its token is checked is bounded by
//! [`super::admission`]: a small greeting, read within a deadline, by one of few pending threads.

use super::admission::{Admission, Deadline, GREETING_TIMEOUT, MAX_GREETING, Pending};
use super::protocol::{MAX_FRAME, Op, Reader, VERSION, Writer, read_frame, read_frame_within, status, write_frame};
use crate::error::{Error, Result};
use std::collections::HashMap;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most bytes the map may hold in total; a set beyond it is refused.
pub const MAX_STORE_BYTES: usize = 1 << 30;

/// The longest a peer may make a `get` or `wait` block (its own time-out is usually far shorter).
const MAX_WAIT: Duration = Duration::from_secs(24 * 3600);

#[derive(Default)]
struct State {
    map: Mutex<HashMap<String, Vec<u8>>>,
    changed: Condvar,
}

/// A running store server. Dropping it stops accepting and joins the accept thread.
pub struct StoreServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    book: Arc<Admission>,
}

impl StoreServer {
    /// Listens on `host:port` (port 0 picks a free one).
    ///
    /// # Errors
    /// [`Error::PortInUse`] when the port is taken; [`Error::Io`] for other bind failures.
    pub fn bind(host: &str, port: u16, token: Option<String>) -> Result<Self> {
        let listener = TcpListener::bind((host, port)).map_err(|e| match e.kind() {
            io::ErrorKind::AddrInUse => Error::PortInUse { addr: host.to_string(), port },
            _ => Error::io(format!("binding the store to {host}:{port}"), e),
        })?;
        let addr = listener.local_addr().map_err(|e| Error::io("store local address", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let state = Arc::new(State::default());
        let book = Arc::new(Admission::default());
        let (stop2, book2) = (stop.clone(), book.clone());
        let accept = std::thread::Builder::new()
            .name("burn-ddp-store".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if stop2.load(Ordering::SeqCst) {
                        break;
                    }
                    let Ok(conn) = conn else { continue };
                    // Booked here, before a thread exists: at most MAX_PENDING threads wait
                    // for greetings, however fast strangers connect.
                    let Ok(pending) = book2.admit(&conn) else { continue };
                    let (state, token, book) = (state.clone(), token.clone(), book2.clone());
                    let _ = std::thread::Builder::new()
                        .name("burn-ddp-store-conn".into())
                        .spawn(move || connection(conn, pending, &state, token.as_deref(), &book));
                }
            })
            .map_err(|e| Error::io("spawning the store thread", e))?;
        Ok(Self { addr, stop, accept: Some(accept), book })
    }

    /// Connections refused so far (bad or missing greeting, wrong token, over the caps), by
    /// address.
    pub fn refusals(&self) -> std::collections::HashMap<std::net::IpAddr, u64> {
        self.book.refusals()
    }

    /// Connections waiting for their greeting now (at most [`super::admission::MAX_PENDING`]).
    pub fn pending_connections(&self) -> usize {
        self.book.pending()
    }

    /// The address the server listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(t) = self.accept.take() {
            let _ = t.join();
        }
    }
}

fn invalid(msg: impl Into<String>) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg.into())
}

/// One connection's life: admitted as pending, greeted, then served until it closes.
fn connection(conn: TcpStream, pending: Pending, state: &State, token: Option<&str>, book: &Admission) {
    let peer = conn.peer_addr().map(|a| a.ip()).unwrap_or(std::net::IpAddr::from([0, 0, 0, 0]));
    match greet(&conn, token) {
        Ok(()) => {}
        Err(e) => return book.refuse(peer, &e.to_string()),
    }
    let Some(_open) = book.authenticated(pending) else {
        return book.refuse(peer, "too many open connections");
    };
    if let Err(e) = serve(conn, state)
        && e.kind() != io::ErrorKind::UnexpectedEof
    {
        log::warn!("store: closed connection from {peer}: {e}");
    }
}

/// Reads the greeting (small, within [`GREETING_TIMEOUT`]) and checks version and token.
fn greet(conn: &TcpStream, token: Option<&str>) -> io::Result<()> {
    conn.set_nodelay(true)?;
    // A stranger that never reads cannot hold the thread in a write either.
    conn.set_write_timeout(Some(GREETING_TIMEOUT))?;
    let hello = read_frame_within(&mut Deadline::new(conn, GREETING_TIMEOUT), MAX_GREETING)?;
    let mut r = Reader(&hello);
    if r.u8()? != Op::Hello as u8 {
        return Err(invalid("first message is not a greeting"));
    }
    let version = r.u32()?;
    let their_token = r.bytes()?;
    let mut conn = conn;
    if version != VERSION {
        write_frame(
            &mut conn,
            &Writer::default()
                .u8(status::ERROR)
                .bytes(format!("protocol version {version}, server speaks {VERSION}").as_bytes())
                .0,
        )?;
        return Err(invalid(format!("protocol version {version}")));
    }
    if token.is_some_and(|t| t.as_bytes() != their_token) {
        write_frame(&mut conn, &Writer::default().u8(status::ERROR).bytes(b"wrong BURN_DDP_TOKEN").0)?;
        return Err(invalid("wrong token"));
    }
    write_frame(&mut conn, &[status::OK])?;
    conn.set_write_timeout(None)?;
    conn.set_read_timeout(None)
}

fn serve(mut conn: TcpStream, state: &State) -> io::Result<()> {
    loop {
        let msg = read_frame(&mut conn)?;
        let reply = handle(&msg, state)?;
        write_frame(&mut conn, &reply)?;
    }
}

fn missing_keys<'a>(map: &HashMap<String, Vec<u8>>, keys: &'a [String]) -> Vec<&'a String> {
    keys.iter().filter(|k| !map.contains_key(*k)).collect()
}

fn handle(msg: &[u8], state: &State) -> io::Result<Vec<u8>> {
    let mut r = Reader(msg);
    let op = Op::from_byte(r.u8()?).ok_or_else(|| invalid(format!("unknown opcode {}", msg[0])))?;
    let ok = Writer::default().u8(status::OK);
    Ok(match op {
        Op::Hello => return Err(invalid("greeting sent twice")),
        Op::Set => {
            let key = r.key()?;
            let value = r.bytes()?.to_vec();
            let mut map = state.map.lock().expect("store poisoned");
            let total: usize = map.values().map(Vec::len).sum();
            if total + value.len() > MAX_STORE_BYTES || value.len() > MAX_FRAME {
                return Ok(Writer::default().u8(status::ERROR).bytes(b"store is full").0);
            }
            map.insert(key, value);
            state.changed.notify_all();
            ok.0
        }
        Op::Get | Op::Wait => {
            let keys = if op == Op::Get { vec![r.key()?] } else { r.keys()? };
            // A peer's time-out is capped: `now + u64::MAX ms` would overflow (and panic).
            let timeout = Duration::from_millis(r.u64()?).min(MAX_WAIT);
            let deadline = Instant::now() + timeout;
            let mut map = state.map.lock().expect("store poisoned");
            loop {
                let missing = missing_keys(&map, &keys);
                if missing.is_empty() {
                    break;
                }
                let now = Instant::now();
                if now >= deadline {
                    let list: Vec<&str> = missing.iter().map(|s| s.as_str()).collect();
                    return Ok(super::protocol::write_keys(Writer::default().u8(status::TIMEOUT), &list).0);
                }
                map = state.changed.wait_timeout(map, deadline - now).expect("store poisoned").0;
            }
            if op == Op::Get { ok.bytes(&map[&keys[0]]).0 } else { ok.0 }
        }
        Op::Add => {
            let key = r.key()?;
            let delta = r.u64()? as i64;
            let mut map = state.map.lock().expect("store poisoned");
            let current = match map.get(&key) {
                None => 0,
                Some(v) => std::str::from_utf8(v)
                    .ok()
                    .and_then(|s| s.parse::<i64>().ok())
                    .ok_or_else(|| invalid(format!("add on non-integer key {key}")))?,
            };
            let new = current
                .checked_add(delta)
                .ok_or_else(|| invalid(format!("add on {key} overflows: {current} + {delta}")))?;
            map.insert(key, new.to_string().into_bytes());
            state.changed.notify_all();
            ok.u64(new as u64).0
        }
        Op::Delete => {
            let key = r.key()?;
            let existed = state.map.lock().expect("store poisoned").remove(&key).is_some();
            ok.u8(existed as u8).0
        }
        Op::Check => {
            let keys = r.keys()?;
            let map = state.map.lock().expect("store poisoned");
            let mut w = ok;
            for k in &keys {
                w = w.u8(map.contains_key(k) as u8);
            }
            w.0
        }
    })
}

/// The decoders under random input: whatever a peer sends, the server answers or drops the
/// connection — it never panics, and never allocates past `MAX_FRAME` / `MAX_KEYS` × `MAX_KEY`.
#[cfg(test)]
mod fuzz {
    use super::super::protocol::MAX_KEYS;
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 3000, failure_persistence: None, ..ProptestConfig::default() })]

        #[test]
        fn frames_never_panic_or_read_past_their_bound(bytes in proptest::collection::vec(any::<u8>(), 0..96), huge in any::<bool>()) {
            let mut input = bytes.clone();
            if huge && input.len() >= 4 {
                input[..4].copy_from_slice(&(MAX_FRAME as u32 + 1).to_le_bytes());
            }
            if let Ok(frame) = read_frame(&mut &input[..]) {
                prop_assert!(frame.len() + 4 <= input.len());
                prop_assert_eq!(&frame[..], &input[4..4 + frame.len()]);
            }
        }

        /// Every request but the blocking ones (get / wait on keys nobody sets), whose
        /// decoding is the key list and the time-out, fuzzed below.
        #[test]
        fn requests_never_panic(op in prop_oneof![Just(0u8), Just(1), Just(2), Just(4), Just(6), Just(7), 8u8..=255], body in proptest::collection::vec(any::<u8>(), 0..128)) {
            let state = State::default();
            let mut msg = vec![op];
            msg.extend_from_slice(&body);
            let _ = handle(&msg, &state);
            let total: usize = state.map.lock().unwrap().values().map(Vec::len).sum();
            prop_assert!(total <= body.len());
        }

        #[test]
        fn key_lists_and_time_outs_never_panic(body in proptest::collection::vec(any::<u8>(), 0..128)) {
            let mut r = Reader(&body);
            if let Ok(keys) = r.keys() {
                prop_assert!(keys.len() <= MAX_KEYS && keys.iter().map(String::len).sum::<usize>() <= body.len());
                let _ = r.u64();
            }
        }
    }
}
