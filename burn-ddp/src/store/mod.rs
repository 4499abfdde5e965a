//! The rendezvous key/value store (PyTorch's TCPStore): rank 0 serves it on
//! MASTER_ADDR:MASTER_PORT, every rank connects as a client.

pub mod admission;
pub mod client;
pub mod protocol;
pub mod server;

pub use client::{MissingKeys, Store, TcpStore};
pub use server::StoreServer;

#[cfg(test)]
mod tests;
