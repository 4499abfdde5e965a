//! The store client: one connection to the server, requests serialised by a mutex.

use super::protocol::{Op, Reader, VERSION, Writer, read_frame, status, write_frame, write_keys};
use crate::error::{Error, Result};
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// The key/value verbs rendezvous needs, as PyTorch's c10d Store.
pub trait Store: Send + Sync {
    /// Sets `key` to `value`.
    ///
    /// # Errors
    /// On connection failure or a refused request.
    fn set(&self, key: &str, value: &[u8]) -> Result<()>;
    /// The value of `key`, waiting up to the store's timeout for it to be set.
    ///
    /// # Errors
    /// [`Error::Timeout`] when it is not set in time.
    fn get(&self, key: &str) -> Result<Vec<u8>>;
    /// Adds `delta` to the integer at `key` (0 when absent) and returns the new value.
    ///
    /// # Errors
    /// On connection failure or a non-integer value.
    fn add(&self, key: &str, delta: i64) -> Result<i64>;
    /// Waits until every key is set.
    ///
    /// # Errors
    /// [`Error::Store`] listing the keys still missing after `timeout`.
    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()>;
    /// Removes `key`; returns whether it existed.
    ///
    /// # Errors
    /// On connection failure.
    fn delete(&self, key: &str) -> Result<bool>;
    /// Which of `keys` are set, without waiting.
    ///
    /// # Errors
    /// On connection failure.
    fn check(&self, keys: &[&str]) -> Result<Vec<bool>>;
}

/// A connection to a [`crate::store::server::StoreServer`].
pub struct TcpStore {
    conn: Mutex<TcpStream>,
    timeout: Duration,
    server: String,
}

/// Why a `wait` failed: the keys that never appeared.
#[derive(Debug)]
pub struct MissingKeys(pub Vec<String>);

impl TcpStore {
    /// Connects to `host:port`, retrying until `timeout` (the server may start later).
    ///
    /// # Errors
    /// [`Error::Timeout`] if no server answers in time; [`Error::Store`] if it refuses the token.
    pub fn connect(host: &str, port: u16, token: Option<&str>, timeout: Duration) -> Result<Self> {
        let server = format!("{host}:{port}");
        let start = Instant::now();
        let addrs: Vec<SocketAddr> =
            (host, port).to_socket_addrs().map_err(|e| Error::io(format!("resolving {server}"), e))?.collect();
        loop {
            if let Some(mut conn) =
                addrs.iter().find_map(|a| TcpStream::connect_timeout(a, Duration::from_secs(2)).ok())
            {
                // A greeting cut off (the server closed a connection it had no room for while
                // strangers flooded it) is tried again; a refusal is final.
                match greet(&mut conn, token) {
                    Ok(Ok(())) => return Ok(Self { conn: Mutex::new(conn), timeout, server }),
                    Ok(Err(msg)) => {
                        return Err(Error::Store { reason: format!("{server} refused the connection: {msg}") });
                    }
                    Err(e) if start.elapsed() >= timeout => return Err(Error::io(format!("greeting {server}"), e)),
                    Err(e) => log::debug!("greeting {server} failed ({e}); trying again"),
                }
            }
            if start.elapsed() >= timeout {
                return Err(Error::Timeout {
                    op: format!("connecting to the store at {server}"),
                    rank: usize::MAX,
                    waited: start.elapsed(),
                    missing: vec![0],
                });
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The address of the local end of the connection: the interface that reaches the server.
    pub fn local_ip(&self) -> Result<std::net::IpAddr> {
        let c = self.conn.lock().expect("store connection poisoned");
        c.local_addr().map(|a| a.ip()).map_err(|e| Error::io("store local address", e))
    }

    /// The default timeout of `get`.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    fn request(&self, payload: Writer) -> Result<Vec<u8>> {
        let mut c = self.conn.lock().expect("store connection poisoned");
        write_frame(&mut *c, &payload.0).map_err(|e| Error::io(format!("store request to {}", self.server), e))?;
        read_frame(&mut *c).map_err(|e| Error::io(format!("store reply from {} (did rank 0 exit?)", self.server), e))
    }

    /// Waits for `keys`; on timeout returns the missing ones.
    ///
    /// # Errors
    /// On connection failure.
    pub fn wait_missing(&self, keys: &[&str], timeout: Duration) -> Result<std::result::Result<(), MissingKeys>> {
        let reply = self.request(write_keys(Writer::op(Op::Wait), keys).u64(timeout.as_millis() as u64))?;
        self.parse_wait(&reply)
    }

    fn parse_wait(&self, reply: &[u8]) -> Result<std::result::Result<(), MissingKeys>> {
        match reply.first() {
            Some(&status::OK) => Ok(Ok(())),
            Some(&status::TIMEOUT) => {
                let keys = Reader(&reply[1..]).keys().map_err(|e| Error::io("store reply", e))?;
                Ok(Err(MissingKeys(keys)))
            }
            _ => Err(self.refused(reply)),
        }
    }

    fn refused(&self, reply: &[u8]) -> Error {
        Error::Store { reason: format!("{} refused the request: {}", self.server, error_message(reply)) }
    }
}

impl Store for TcpStore {
    fn set(&self, key: &str, value: &[u8]) -> Result<()> {
        let reply = self.request(Writer::op(Op::Set).bytes(key.as_bytes()).bytes(value))?;
        if reply.first() == Some(&status::OK) { Ok(()) } else { Err(self.refused(&reply)) }
    }

    fn get(&self, key: &str) -> Result<Vec<u8>> {
        let reply = self.request(Writer::op(Op::Get).bytes(key.as_bytes()).u64(self.timeout.as_millis() as u64))?;
        match reply.first() {
            Some(&status::OK) => {
                Reader(&reply[1..]).bytes().map(<[u8]>::to_vec).map_err(|e| Error::io("store reply", e))
            }
            Some(&status::TIMEOUT) => {
                Err(Error::Store { reason: format!("key `{key}` was not set within {:?}", self.timeout) })
            }
            _ => Err(self.refused(&reply)),
        }
    }

    fn add(&self, key: &str, delta: i64) -> Result<i64> {
        let reply = self.request(Writer::op(Op::Add).bytes(key.as_bytes()).u64(delta as u64))?;
        match reply.first() {
            Some(&status::OK) => Reader(&reply[1..]).u64().map(|v| v as i64).map_err(|e| Error::io("store reply", e)),
            _ => Err(self.refused(&reply)),
        }
    }

    fn wait(&self, keys: &[&str], timeout: Duration) -> Result<()> {
        self.wait_missing(keys, timeout)?.map_err(|MissingKeys(missing)| Error::Store {
            reason: format!("keys not set within {timeout:?}: {}", missing.join(", ")),
        })
    }

    fn delete(&self, key: &str) -> Result<bool> {
        let reply = self.request(Writer::op(Op::Delete).bytes(key.as_bytes()))?;
        match reply.first() {
            Some(&status::OK) => Ok(reply.get(1) == Some(&1)),
            _ => Err(self.refused(&reply)),
        }
    }

    fn check(&self, keys: &[&str]) -> Result<Vec<bool>> {
        let reply = self.request(write_keys(Writer::op(Op::Check), keys))?;
        match reply.first() {
            Some(&status::OK) if reply.len() == keys.len() + 1 => Ok(reply[1..].iter().map(|&b| b == 1).collect()),
            _ => Err(self.refused(&reply)),
        }
    }
}

/// Sends the greeting and reads the answer: `Ok(Err(message))` when the server refuses it.
fn greet(conn: &mut TcpStream, token: Option<&str>) -> std::io::Result<std::result::Result<(), String>> {
    conn.set_nodelay(true)?;
    let hello = Writer::op(Op::Hello).u32(VERSION).bytes(token.unwrap_or("").as_bytes());
    write_frame(conn, &hello.0)?;
    let reply = read_frame(conn)?;
    if reply.first() == Some(&status::OK) {
        return Ok(Ok(()));
    }
    Ok(Err(error_message(&reply)))
}

/// The message of a reply whose status is not OK (empty when it carries none).
fn error_message(reply: &[u8]) -> String {
    Reader(reply.get(1..).unwrap_or_default())
        .bytes()
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}
