//! What keeps an NCCL group's asynchronous collectives honest once the host no longer waits for
//! them: the communicator's state shared with a watchdog thread, CUDA events around every
//! collective, and that thread, which follows them in order — it adds each one's device time to
//! the process's collective clock (and to the trace, at its device-side start), and aborts the
//! communicator when one outlives the group's time-out or NCCL reports an asynchronous error
//! (a peer died): the aborted collectives end, burn's stream goes on, and every later call of the
//! group returns the recorded error. PyTorch's NCCL watchdog plays the same part.

use crate::collective_time;
use crate::error::{Error, Result};
use cudarc::driver::{CudaContext, sys as driver};
use cudarc::nccl::{result as nr, sys as ns};
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

pub(super) fn cuda_err(op: &str, e: impl std::fmt::Debug) -> Error {
    Error::Cuda { op: op.to_string(), reason: format!("{e:?}") }
}

/// The raw communicator.
#[derive(Clone, Copy)]
pub(super) struct Comm(pub(super) ns::ncclComm_t);
// SAFETY: the communicator is used under `CommState`'s mutex, or (abort, error query) from the
// watchdog, which NCCL allows from another thread.
unsafe impl Send for Comm {}

/// The communicator (gone once aborted or destroyed) and why it failed.
pub(super) struct CommState {
    comm: Mutex<Option<Comm>>,
    failure: Mutex<Option<String>>,
    rank: usize,
}

impl CommState {
    pub fn new(comm: ns::ncclComm_t, rank: usize) -> Self {
        Self { comm: Mutex::new(Some(Comm(comm))), failure: Mutex::new(None), rank }
    }

    /// Runs `f` with the live communicator (under its lock), or returns the recorded failure.
    pub fn with<T>(&self, op: &str, f: impl FnOnce(ns::ncclComm_t) -> Result<T>) -> Result<T> {
        let guard = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        match *guard {
            Some(Comm(c)) => f(c),
            None => Err(self.failure(op)),
        }
    }

    /// The error every call gets once the communicator is gone.
    pub fn failure(&self, op: &str) -> Error {
        let why = self
            .failure
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or_else(|| "the communicator was destroyed".into());
        Error::Cuda {
            op: op.into(),
            reason: format!(
                "{why}; the NCCL group is unusable — restart the job (burn-ddp launch --max-restarts N restarts it)"
            ),
        }
    }

    /// NCCL's asynchronous error, when it reports one (a peer failed, a network error).
    pub fn async_error(&self) -> Option<String> {
        let guard = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        let Comm(c) = (*guard)?;
        let mut e = ns::ncclResult_t::ncclSuccess;
        // SAFETY: a live communicator; out-pointer to a local.
        unsafe { ns::ncclCommGetAsyncError(c, &mut e) };
        (e != ns::ncclResult_t::ncclSuccess && e != ns::ncclResult_t::ncclInProgress)
            .then(|| format!("NCCL asynchronous error {e:?} (a peer failed or the network broke)"))
    }

    /// Why collective `what`, running for `waited`, must stop: NCCL's asynchronous error, or
    /// the time-out (then `true`).
    pub fn stop_reason(&self, what: &str, waited: Duration, timeout: Duration) -> Option<(String, bool)> {
        if let Some(e) = self.async_error() {
            return Some((e, false));
        }
        let secs = timeout.as_secs_f64();
        (waited > timeout).then(|| (format!("{what} did not finish within the collective time-out ({secs:.0} s; BURN_DDP_TIMEOUT_S sets it): a peer rank is dead or stuck"), true))
    }

    /// Aborts the communicator (its pending collectives end) and records `why`; once.
    pub fn abort(&self, why: String) {
        let mut guard = self.comm.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Comm(c)) = guard.take() {
            log::error!("rank {}: {why}; aborting the NCCL communicator", self.rank);
            self.failure.lock().unwrap_or_else(|p| p.into_inner()).get_or_insert(why);
            // SAFETY: abort is the documented way out of a hung or failed communicator.
            let _ = unsafe { nr::comm_abort(c) };
        }
    }

    /// Destroys the communicator when it is still live.
    pub fn destroy(&self) {
        if let Some(Comm(c)) = self.comm.lock().unwrap_or_else(|p| p.into_inner()).take() {
            // SAFETY: not used after this.
            let _ = unsafe { nr::comm_destroy(c) };
        }
    }
}

/// A pair of CUDA events around one collective on the group's stream.
pub(super) struct Events {
    pub start: driver::CUevent,
    pub end: driver::CUevent,
}

// SAFETY: events are plain driver handles; each pair is used by one thread at a time.
unsafe impl Send for Events {}

impl Events {
    pub fn new() -> Result<Self> {
        let make = || {
            let mut e = std::ptr::null_mut();
            // SAFETY: out-pointer to a local; default flags (timing enabled).
            unsafe { driver::cuEventCreate(&mut e, 0) }.result().map(|()| e).map_err(|e| cuda_err("cuEventCreate", e))
        };
        Ok(Self { start: make()?, end: make()? })
    }

    /// Records `which` on `stream`.
    pub fn record(event: driver::CUevent, stream: driver::CUstream) -> Result<()> {
        // SAFETY: a live event and a stream of the same context.
        unsafe { driver::cuEventRecord(event, stream) }.result().map_err(|e| cuda_err("cuEventRecord", e))
    }

    /// `Some(true)` once `end` has completed, `Some(false)` while not, `None` on an error.
    pub fn done(&self) -> Option<bool> {
        // SAFETY: a live event.
        match unsafe { driver::cuEventQuery(self.end) } {
            driver::CUresult::CUDA_SUCCESS => Some(true),
            driver::CUresult::CUDA_ERROR_NOT_READY => Some(false),
            _ => None,
        }
    }

    /// Milliseconds from `a` to `b`, both completed.
    pub fn between(a: driver::CUevent, b: driver::CUevent) -> f64 {
        let mut ms = 0f32;
        // SAFETY: live events, both completed.
        let _ = unsafe { driver::cuEventElapsedTime(&mut ms, a, b) };
        f64::from(ms)
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        // SAFETY: created by `new`, destroyed once.
        unsafe {
            let _ = driver::cuEventDestroy_v2(self.start);
            let _ = driver::cuEventDestroy_v2(self.end);
        }
    }
}

/// One asynchronous collective the watchdog follows.
pub(super) struct Ticket {
    pub label: String,
    pub bytes: usize,
    pub enqueued: Instant,
    pub events: Events,
}

struct Shared {
    queue: Mutex<VecDeque<Ticket>>,
    wake: Condvar,
    stop: AtomicBool,
    /// Event pairs of collectives that have ended, for the next ones (creating and destroying
    /// two CUDA events per bucket is driver work on the enqueueing thread every step).
    spare: Mutex<Vec<Events>>,
}

/// Spare event pairs kept per group, at most.
const SPARE_EVENTS: usize = 64;

/// How long the watchdog sleeps between looks at a collective still running. Its time-out is
/// minutes and its device times are read once it has ended, so it looks rarely: each look is
/// a driver call beside the threads that launch burn's kernels (PyTorch's watchdog looks every
/// 100 ms).
const POLL: Duration = Duration::from_millis(1);

/// The watchdog thread of one group.
pub(super) struct Watchdog {
    shared: Arc<Shared>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// What the watchdog needs of its group.
pub(super) struct Watched {
    pub state: Arc<CommState>,
    pub ctx: Arc<CudaContext>,
    pub timeout: Duration,
    /// An event completed on the group's stream at `anchor`: device times → host instants.
    pub origin: (Events, Instant),
    pub device: usize,
}

impl Watchdog {
    pub fn spawn(watched: Watched) -> Self {
        let shared = Arc::new(Shared {
            queue: Mutex::new(VecDeque::new()),
            wake: Condvar::new(),
            stop: AtomicBool::new(false),
            spare: Mutex::new(Vec::new()),
        });
        let s = shared.clone();
        let thread = std::thread::Builder::new()
            .name(format!("NCCL stream GPU {} (device time)", watched.device))
            .spawn(move || watch(&s, &watched))
            .expect("spawning the NCCL watchdog thread");
        Self { shared, thread: Some(thread) }
    }

    /// A pair of events for the next collective: a spare one, or new.
    ///
    /// # Errors
    /// When the driver cannot create them.
    pub fn events(&self) -> Result<Events> {
        match self.shared.spare.lock().unwrap_or_else(|p| p.into_inner()).pop() {
            Some(events) => Ok(events),
            None => Events::new(),
        }
    }

    /// Follows `ticket` (enqueued after every ticket handed over before).
    pub fn follow(&self, ticket: Ticket) {
        self.shared.queue.lock().unwrap_or_else(|p| p.into_inner()).push_back(ticket);
        self.shared.wake.notify_one();
    }
}

impl Drop for Watchdog {
    /// Returns once every followed collective has ended (or was aborted).
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.shared.wake.notify_one();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn watch(shared: &Shared, w: &Watched) {
    let _ = w.ctx.bind_to_thread();
    loop {
        let front = {
            let mut q = shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            if q.is_empty() {
                if shared.stop.load(Ordering::SeqCst) {
                    return;
                }
                let (guard, _) =
                    shared.wake.wait_timeout(q, Duration::from_millis(50)).unwrap_or_else(|p| p.into_inner());
                q = guard;
            }
            q.pop_front()
        };
        let Some(ticket) = front else { continue };
        if follow_one(&ticket, w) {
            let mut spare = shared.spare.lock().unwrap_or_else(|p| p.into_inner());
            if spare.len() < SPARE_EVENTS {
                spare.push(ticket.events);
            }
        }
    }
}

/// Waits for `t` to end: its device time is counted, or the communicator is aborted after the
/// time-out or NCCL's asynchronous error (and, should the aborted collective still not end,
/// the process exits: burn's stream waits for it, so nothing else could make progress).
/// Returns whether it ended normally (its events may serve again).
fn follow_one(t: &Ticket, w: &Watched) -> bool {
    let mut aborted: Option<Instant> = None;
    loop {
        match t.events.done() {
            Some(true) => {
                count(t, w);
                return aborted.is_none();
            }
            Some(false) => {}
            None => w.state.abort(format!("{}: the CUDA event after it failed", t.label)),
        }
        if aborted.is_none() {
            if let Some((why, _)) = w.state.stop_reason(&t.label, t.enqueued.elapsed(), w.timeout) {
                w.state.abort(why);
                aborted = Some(Instant::now());
            }
        } else if aborted.is_some_and(|a| a.elapsed() > Duration::from_secs(30)) {
            log::error!("{} still runs 30 s after the NCCL communicator was aborted; exiting", t.label);
            eprintln!("burn-ddp: {}", w.state.failure(&t.label));
            std::process::exit(1);
        }
        std::thread::sleep(POLL);
    }
}

fn count(t: &Ticket, w: &Watched) {
    let ms = Events::between(t.events.start, t.events.end);
    collective_time::add_seconds(ms * 1e-3);
    if crate::trace::enabled() {
        let start =
            w.origin.1 + Duration::from_secs_f64(Events::between(w.origin.0.end, t.events.start).max(0.0) * 1e-3);
        let args = serde_json::json!({ "bytes": t.bytes, "device_ms": ms, "clock": "device (CUDA events)" });
        crate::trace::record(t.label.clone(), "comm", start, start + Duration::from_secs_f64(ms * 1e-3), args);
    }
}
