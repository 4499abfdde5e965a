//! The store's wire format: length-prefixed frames with bounded sizes.
//!
//! A frame is a little-endian `u32` length followed by that many bytes. A request is an opcode
//! byte followed by fields; strings and byte arrays are `u32`-length-prefixed. Every length is
//! checked against [`MAX_FRAME`] / [`MAX_KEY`] before anything is allocated.

use std::io::{self, Read, Write};

/// Largest frame accepted (values up to this size minus headers).
pub const MAX_FRAME: usize = 64 << 20;
/// Longest key accepted.
pub const MAX_KEY: usize = 4096;
/// Most keys in one `wait`.
pub const MAX_KEYS: usize = 65_536;
/// Protocol version sent in the greeting.
pub const VERSION: u32 = 1;

/// Request opcodes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Op {
    /// Greeting: version, token.
    Hello = 1,
    /// key, value.
    Set = 2,
    /// key, timeout_ms → value.
    Get = 3,
    /// key, delta → new value.
    Add = 4,
    /// keys, timeout_ms → ok.
    Wait = 5,
    /// key → existed.
    Delete = 6,
    /// keys → which exist (one byte each).
    Check = 7,
}

impl Op {
    /// Decodes an opcode byte.
    pub fn from_byte(b: u8) -> Option<Self> {
        Some(match b {
            1 => Op::Hello,
            2 => Op::Set,
            3 => Op::Get,
            4 => Op::Add,
            5 => Op::Wait,
            6 => Op::Delete,
            7 => Op::Check,
            _ => return None,
        })
    }
}

/// Response status bytes.
pub mod status {
    /// Success; payload follows.
    pub const OK: u8 = 0;
    /// The wait ran out; payload is the missing keys.
    pub const TIMEOUT: u8 = 1;
    /// The request was refused; payload is a message.
    pub const ERROR: u8 = 2;
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, payload: &[u8]) -> io::Result<()> {
    if payload.len() > MAX_FRAME {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("frame of {} bytes exceeds {MAX_FRAME}", payload.len()),
        ));
    }
    w.write_all(&(payload.len() as u32).to_le_bytes())?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame, refusing lengths over [`MAX_FRAME`] before allocating.
pub fn read_frame(r: &mut impl Read) -> io::Result<Vec<u8>> {
    read_frame_within(r, MAX_FRAME)
}

/// Reads one frame of at most `max` bytes. The buffer grows with the bytes that arrive, so a
/// peer that announces a large frame and sends little of it holds little memory.
pub fn read_frame_within(r: &mut impl Read, max: usize) -> io::Result<Vec<u8>> {
    let mut len = [0u8; 4];
    r.read_exact(&mut len)?;
    let len = u32::from_le_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(io::ErrorKind::InvalidData, format!("frame of {len} bytes exceeds {max}")));
    }
    let mut buf = Vec::with_capacity(len.min(64 << 10));
    r.take(len as u64).read_to_end(&mut buf)?;
    if buf.len() < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame ended after {} of {len} bytes", buf.len()),
        ));
    }
    Ok(buf)
}

/// Builds a payload field by field.
#[derive(Default)]
pub struct Writer(pub Vec<u8>);

impl Writer {
    /// Starts a request with `op`.
    pub fn op(op: Op) -> Self {
        Writer(vec![op as u8])
    }
    /// Appends a `u8`.
    pub fn u8(mut self, v: u8) -> Self {
        self.0.push(v);
        self
    }
    /// Appends a little-endian `u32`.
    pub fn u32(mut self, v: u32) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a little-endian `u64`.
    pub fn u64(mut self, v: u64) -> Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a length-prefixed byte string.
    pub fn bytes(mut self, v: &[u8]) -> Self {
        self.0.extend_from_slice(&(v.len() as u32).to_le_bytes());
        self.0.extend_from_slice(v);
        self
    }
}

/// Reads fields from a payload; every read is bounds-checked.
pub struct Reader<'a>(pub &'a [u8]);

fn short() -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, "message shorter than its fields")
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> io::Result<&'a [u8]> {
        if self.0.len() < n {
            return Err(short());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }
    /// Reads a `u8`.
    pub fn u8(&mut self) -> io::Result<u8> {
        Ok(self.take(1)?[0])
    }
    /// Reads a `u32`.
    pub fn u32(&mut self) -> io::Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    /// Reads a `u64`.
    pub fn u64(&mut self) -> io::Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
    /// Reads a length-prefixed byte string.
    pub fn bytes(&mut self) -> io::Result<&'a [u8]> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// Reads a key (length-prefixed UTF-8, at most [`MAX_KEY`] bytes).
    pub fn key(&mut self) -> io::Result<String> {
        let b = self.bytes()?;
        if b.len() > MAX_KEY {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("key of {} bytes exceeds {MAX_KEY}", b.len()),
            ));
        }
        String::from_utf8(b.to_vec()).map_err(|_| io::Error::new(io::ErrorKind::InvalidData, "key is not UTF-8"))
    }
    /// Reads a count-prefixed list of keys.
    pub fn keys(&mut self) -> io::Result<Vec<String>> {
        let n = self.u32()? as usize;
        if n > MAX_KEYS {
            return Err(io::Error::new(io::ErrorKind::InvalidData, format!("{n} keys exceed {MAX_KEYS}")));
        }
        (0..n).map(|_| self.key()).collect()
    }
}

/// Appends a count-prefixed list of keys.
pub fn write_keys(mut w: Writer, keys: &[&str]) -> Writer {
    w = w.u32(keys.len() as u32);
    for k in keys {
        w = w.bytes(k.as_bytes());
    }
    w
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_oversize_is_refused_before_allocation() {
        let mut buf = Vec::new();
        write_frame(&mut buf, b"hello").unwrap();
        assert_eq!(read_frame(&mut &buf[..]).unwrap(), b"hello");
        let huge = (u32::MAX).to_le_bytes();
        let err = read_frame(&mut &huge[..]).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        let err = read_frame_within(&mut &buf[..], 4).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData, "a frame over the given bound");
        let cut = &buf[..buf.len() - 1];
        assert_eq!(read_frame(&mut &cut[..]).unwrap_err().kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn reader_rejects_short_and_bad_fields() {
        let w = write_keys(Writer::op(Op::Wait), &["a", "bb"]).u64(5);
        let mut r = Reader(&w.0[1..]);
        assert_eq!(r.keys().unwrap(), ["a", "bb"]);
        assert_eq!(r.u64().unwrap(), 5);
        assert!(r.u8().is_err());
        let lying = Writer::default().u32(1_000).0;
        assert!(Reader(&lying).bytes().is_err());
        let many = Writer::default().u32(u32::MAX).0;
        assert!(Reader(&many).keys().is_err());
    }
}
