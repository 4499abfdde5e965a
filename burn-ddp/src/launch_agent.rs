//! Agreement between the launchers of a multi-node job (`--nnodes` > 1), as torchrun's agents
//! keep through their store: node 0's launcher serves a small store on `--master-port` + 1
//! (the ranks' own store is on `--master-port`). A rank that fails on any node ends the round
//! on every node at once (not after the collectives' time-out), and no node starts round k + 1
//! before every node has stopped round k's ranks (so no new rank meets an old rank 0's store).

use crate::error::{Error, Result};
use crate::store::client::Store;
use crate::store::client::TcpStore;
use crate::store::server::StoreServer;
use std::time::Duration;

/// This launcher's link to the others.
pub struct NodeLink {
    /// Node 0 serves; the others hold `None`.
    _server: Option<StoreServer>,
    store: TcpStore,
    nnodes: usize,
    node_rank: usize,
    timeout: Duration,
}

fn key(round: usize, what: &str) -> String {
    format!("burn-ddp-launch/round{round}/{what}")
}

impl NodeLink {
    /// Node 0 starts the launchers' store on `port` + 1; every node connects to it.
    ///
    /// # Errors
    /// When the port is taken on node 0, or node 0 cannot be reached within `timeout`.
    pub fn join(master_addr: &str, port: u16, (nnodes, node_rank): (usize, usize), timeout: Duration) -> Result<Self> {
        let port = port.checked_add(1).ok_or(Error::Env {
            name: "--master-port",
            reason: "65535 leaves no port for the launchers' store (it uses --master-port + 1)".into(),
        })?;
        let token = std::env::var("BURN_DDP_TOKEN").ok();
        let server = match node_rank {
            0 => Some(StoreServer::bind("0.0.0.0", port, token.clone()).map_err(|e| match e {
                Error::PortInUse { .. } => Error::Env {
                    name: "--node-rank",
                    reason: format!("node 0's launcher store cannot listen on port {port} (--master-port + 1): another launcher is node 0 already, or another job holds the port"),
                },
                other => other,
            })?),
            _ => None,
        };
        let store = TcpStore::connect(master_addr, port, token.as_deref(), timeout)?;
        if store.add(&format!("burn-ddp-launch/node{node_rank}"), 1)? > 1 {
            return Err(Error::Env {
                name: "--node-rank",
                reason: format!("node {node_rank} joined twice: give every node its own --node-rank in 0..{nnodes}"),
            });
        }
        Ok(Self { _server: server, store, nnodes, node_rank, timeout })
    }

    /// Waits until every node has reached round `round` (so has stopped the ranks of the
    /// rounds before).
    ///
    /// # Errors
    /// When a node does not arrive within the time-out.
    pub fn start_round(&self, round: usize) -> Result<()> {
        if self.store.add(&key(round, "arrived"), 1)? as usize == self.nnodes {
            self.store.set(&key(round, "go"), b"1")?;
        }
        self.store.wait(&[&key(round, "go")], self.timeout).map_err(|_| {
            let arrived = self.store.add(&key(round, "arrived"), 0).unwrap_or(0);
            Error::Env {
                name: "--nnodes",
                reason: format!("{arrived} of {} nodes' launchers arrived within {:?}: start every node (same --master-addr/--master-port), or lower --nnodes", self.nnodes, self.timeout),
            }
        })
    }

    /// Tells every node that `rank` failed with `code` in round `round` (first report wins).
    ///
    /// The first report of a round stands; a store that cannot say whether there was one gets
    /// this one (tried three times), since another node waits on it.
    pub fn report_failure(&self, round: usize, rank: usize, code: i32) {
        let k = key(round, "failed");
        if self.store.check(&[&k]).is_ok_and(|v| v[0]) {
            return;
        }
        let value = format!("{rank} {code} {}", self.node_rank);
        for _ in 0..3 {
            if self.store.set(&k, value.as_bytes()).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
    }

    /// The failure another node reported in round `round`: (rank, exit code, node).
    pub fn failure(&self, round: usize) -> Option<(usize, i32, usize)> {
        let k = key(round, "failed");
        if !self.store.check(&[&k]).ok()?[0] {
            return None;
        }
        let text = String::from_utf8(self.store.get(&k).ok()?).ok()?;
        let mut parts = text.split(' ').map(str::parse::<i64>);
        match (parts.next(), parts.next(), parts.next()) {
            (Some(Ok(r)), Some(Ok(c)), Some(Ok(n))) => Some((r as usize, c as i32, n as usize)),
            _ => None,
        }
    }

    /// After this node's ranks succeeded: node 0 keeps its store up until every node is done
    /// (bounded by the time-out), so no node loses its link while it still watches it.
    pub fn finish(&self, round: usize) {
        let _ = self.store.add(&key(round, "done"), 1);
        if self.node_rank == 0 {
            let deadline = std::time::Instant::now() + self.timeout;
            while std::time::Instant::now() < deadline {
                let done = self.store.add(&key(round, "done"), 0).unwrap_or(0) as usize;
                if done >= self.nnodes || self.failure(round).is_some() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
}
