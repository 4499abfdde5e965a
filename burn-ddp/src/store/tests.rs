//! Store protocol tests over real loopback sockets.

use super::*;
use crate::error::Error;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(5);

fn server(token: Option<&str>) -> (StoreServer, u16) {
    let s = StoreServer::bind("127.0.0.1", 0, token.map(str::to_string)).unwrap();
    let port = s.local_addr().port();
    (s, port)
}

#[test]
fn set_get_add_delete_check() {
    let (_s, port) = server(None);
    let c = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    c.set("a", b"1").unwrap();
    assert_eq!(c.get("a").unwrap(), b"1");
    assert_eq!(c.add("n", 5).unwrap(), 5);
    assert_eq!(c.add("n", -2).unwrap(), 3);
    assert_eq!(c.check(&["a", "zz", "n"]).unwrap(), [true, false, true]);
    assert!(c.delete("a").unwrap());
    assert!(!c.delete("a").unwrap());
    assert!(c.add("b", 1).is_ok());
    c.set("text", b"x").unwrap();
    assert!(c.add("text", 1).is_err(), "add on a non-integer must fail");
}

#[test]
fn get_waits_for_another_client() {
    let (_s, port) = server(None);
    let waiter =
        std::thread::spawn(move || TcpStore::connect("127.0.0.1", port, None, T).unwrap().get("late").unwrap());
    std::thread::sleep(Duration::from_millis(200));
    TcpStore::connect("127.0.0.1", port, None, T).unwrap().set("late", b"here").unwrap();
    assert_eq!(waiter.join().unwrap(), b"here");
}

#[test]
fn wait_times_out_naming_missing_keys() {
    let (_s, port) = server(None);
    let c = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    c.set("k0", b"").unwrap();
    let t = Instant::now();
    let missing = c.wait_missing(&["k0", "k1", "k2"], Duration::from_millis(300)).unwrap().unwrap_err();
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert_eq!(missing.0, ["k1", "k2"]);
    let err = c.wait(&["k9"], Duration::from_millis(50)).unwrap_err().to_string();
    assert!(err.contains("k9"), "{err}");
}

#[test]
fn wrong_token_is_refused() {
    let (_s, port) = server(Some("secret"));
    assert!(TcpStore::connect("127.0.0.1", port, Some("secret"), T).is_ok());
    let err = TcpStore::connect("127.0.0.1", port, Some("guess"), T).err().unwrap().to_string();
    assert!(err.contains("BURN_DDP_TOKEN"), "{err}");
    assert!(TcpStore::connect("127.0.0.1", port, None, T).is_err());
}

#[test]
fn garbage_clients_are_dropped_and_the_server_keeps_serving() {
    let (_s, port) = server(None);
    let good = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    // An oversized length prefix: refused before allocating 4 GiB.
    let mut g = TcpStream::connect(("127.0.0.1", port)).unwrap();
    g.write_all(&u32::MAX.to_le_bytes()).unwrap();
    let mut buf = [0u8; 1];
    g.set_read_timeout(Some(T)).unwrap();
    assert_eq!(g.read(&mut buf).unwrap_or(0), 0, "server should close the connection");
    // Random bytes, then a valid greeting followed by an unknown opcode and a lying length.
    for payload in [&b"GET / HTTP/1.1\r\n\r\n"[..], &[5, 0, 0, 0, 1, 2, 3, 4, 5][..]] {
        let mut g = TcpStream::connect(("127.0.0.1", port)).unwrap();
        g.write_all(payload).unwrap();
        drop(g);
    }
    let mut g = TcpStream::connect(("127.0.0.1", port)).unwrap();
    protocol::write_frame(&mut g, &protocol::Writer::op(protocol::Op::Hello).u32(protocol::VERSION).bytes(b"").0)
        .unwrap();
    assert_eq!(protocol::read_frame(&mut g).unwrap(), [protocol::status::OK]);
    protocol::write_frame(&mut g, &[99, 1, 2]).unwrap();
    protocol::write_frame(&mut g, &protocol::Writer::op(protocol::Op::Set).u32(1 << 30).0).ok();
    good.set("still", b"alive").unwrap();
    assert_eq!(good.get("still").unwrap(), b"alive");
}

#[test]
fn port_in_use_is_a_clear_error() {
    let (_s, port) = server(None);
    match StoreServer::bind("127.0.0.1", port, None) {
        Err(Error::PortInUse { port: p, .. }) => assert_eq!(p, port),
        Err(other) => panic!("wrong error: {other}"),
        Ok(_) => panic!("second bind succeeded"),
    }
}

#[test]
fn connect_times_out_when_nobody_serves() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let t = Instant::now();
    assert!(matches!(
        TcpStore::connect("127.0.0.1", port, None, Duration::from_millis(300)),
        Err(Error::Timeout { .. })
    ));
    assert!(t.elapsed() < Duration::from_secs(5));
}

/// What a hostile or broken peer sends must not take the server down: a counter pushed past
/// i64, a wait of u64::MAX milliseconds on a key that exists. The connection gets an error (or
/// the answer), and the store keeps serving others.
#[test]
fn overflowing_fields_from_a_peer_do_not_take_the_server_down() {
    let (_s, port) = server(None);
    let c = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    assert_eq!(c.add("n", i64::MAX).unwrap(), i64::MAX);
    assert!(c.add("n", 1).is_err(), "an overflowing add must be refused");
    // The server closed that connection (a bad request ends it); others go on.
    let c = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    assert_eq!(c.get("n").unwrap(), i64::MAX.to_string().as_bytes());
    c.set("k", b"v").unwrap();
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.set_read_timeout(Some(T)).unwrap();
    protocol::write_frame(&mut raw, &protocol::Writer::op(protocol::Op::Hello).u32(protocol::VERSION).bytes(b"").0)
        .unwrap();
    let _ = protocol::read_frame(&mut raw).unwrap();
    let get = protocol::write_keys(protocol::Writer::op(protocol::Op::Wait), &["k"]).u64(u64::MAX);
    protocol::write_frame(&mut raw, &get.0).unwrap();
    let answer = protocol::read_frame(&mut raw).unwrap();
    assert_eq!(answer[0], protocol::status::OK, "the key exists: answered at once");
    let other = TcpStore::connect("127.0.0.1", port, None, T).unwrap();
    assert_eq!(other.get("k").unwrap(), b"v", "the server still serves");
}

/// Strangers cost the server little: 300 connections that never greet and 8 that announce a
/// 64 MiB frame instead of a greeting hold at most `MAX_PENDING` slots, are counted as refused,
/// and a rank with the token still gets in and is served.
#[test]
fn stalled_and_oversized_strangers_are_bounded_and_a_rank_still_gets_in() {
    let (s, port) = server(Some("secret"));
    let mut strangers: Vec<TcpStream> = (0..300).map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap()).collect();
    for _ in 0..8 {
        let mut g = TcpStream::connect(("127.0.0.1", port)).unwrap();
        g.write_all(&(protocol::MAX_FRAME as u32).to_le_bytes()).unwrap();
        let _ = g.write_all(&[0u8; 1 << 16]);
        strangers.push(g);
    }
    let rank = TcpStore::connect("127.0.0.1", port, Some("secret"), T).unwrap();
    rank.set("k", b"v").unwrap();
    assert_eq!(rank.get("k").unwrap(), b"v");
    let deadline = Instant::now() + T;
    let refused = || s.refusals().values().sum::<u64>();
    while refused() < 308 - admission::MAX_PENDING as u64 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(s.pending_connections() <= admission::MAX_PENDING, "{} pending", s.pending_connections());
    assert!(refused() >= 308 - admission::MAX_PENDING as u64, "{} refused", refused());
    drop(strangers);
}
