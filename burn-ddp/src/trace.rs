//! Spans for a Chrome / Perfetto trace (the JSON of chrome://tracing, read by
//! ui.perfetto.dev): what the training loop, DDP's buckets and the collectives did, and when.
//! Off by default and one atomic load when off; [`start`] turns recording on for this process,
//! [`stop`] returns the spans, [`chrome_json`] writes them in the trace-event format.

use serde_json::{Value, json};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

static ON: AtomicBool = AtomicBool::new(false);
static SPANS: Mutex<Vec<Span>> = Mutex::new(Vec::new());
/// Every thread that recorded a span: (id, name).
static THREADS: Mutex<Vec<(u64, String)>> = Mutex::new(Vec::new());
static NEXT_THREAD: AtomicU64 = AtomicU64::new(1);

thread_local! {
    static THREAD: u64 = {
        let id = NEXT_THREAD.fetch_add(1, Ordering::Relaxed);
        let name = std::thread::current().name().map_or_else(|| format!("thread {id}"), str::to_string);
        THREADS.lock().unwrap_or_else(|p| p.into_inner()).push((id, name));
        id
    };
}

/// The time every span is measured from.
fn origin() -> Instant {
    static ORIGIN: OnceLock<Instant> = OnceLock::new();
    *ORIGIN.get_or_init(Instant::now)
}

/// One timed piece of work on one thread.
#[derive(Debug, Clone, PartialEq)]
pub struct Span {
    /// What ran, e.g. `forward` or `all-reduce bucket 3`.
    pub name: String,
    /// Its kind: `step`, `phase`, `comm`, ….
    pub cat: &'static str,
    /// The recording thread.
    pub thread: u64,
    /// Microseconds from this process's trace origin.
    pub start_us: f64,
    /// Microseconds it lasted.
    pub dur_us: f64,
    /// Details shown beside the span (bytes, step, …).
    pub args: Value,
}

/// The category of DDP's spans on the calling (training) thread; they include its waits for
/// the backend's threads.
pub const DDP: &str = "ddp";
/// The category of the spans DDP's collectives record on the backend's own threads: a bucket's
/// hand-over to the collective's stream and its join, on burn-fusion's thread and on cubecl's
/// device thread (burn-cuda). Those threads set a host-bound step's pace.
pub const DDP_BACKEND_THREADS: &str = "ddp-backend-threads";
/// The category of the parts of an NCCL collective's enqueue on the device (its timing events,
/// the work before it, the NCCL group, the work after it), on whichever thread enqueues it.
pub const DDP_COLLECTIVE: &str = "ddp-collective";
/// The category of the spans of burn-ddp's enqueue thread (`BURN_DDP_ENQUEUE_THREAD=1`): a
/// bucket's collective enqueued on its stream off cubecl's device thread.
pub const DDP_ENQUEUE_THREAD: &str = "ddp-enqueue-thread";

/// Whether spans are being recorded.
pub fn enabled() -> bool {
    ON.load(Ordering::Relaxed)
}

/// Starts recording (dropping spans of an earlier recording).
pub fn start() {
    origin();
    SPANS.lock().unwrap_or_else(|p| p.into_inner()).clear();
    ON.store(true, Ordering::SeqCst);
}

/// Stops recording and returns the spans, in the order they ended.
pub fn stop() -> Vec<Span> {
    ON.store(false, Ordering::SeqCst);
    std::mem::take(&mut *SPANS.lock().unwrap_or_else(|p| p.into_inner()))
}

/// Records `name` from `start` to `end` on the calling thread, when recording.
pub fn record(name: impl Into<String>, cat: &'static str, start: Instant, end: Instant, args: Value) {
    if !enabled() {
        return;
    }
    let micros = |t: Instant| t.saturating_duration_since(origin()).as_secs_f64() * 1e6;
    let thread = THREAD.with(|t| *t);
    let span = Span {
        name: name.into(),
        cat,
        thread,
        start_us: micros(start),
        dur_us: (micros(end) - micros(start)).max(0.0),
        args,
    };
    SPANS.lock().unwrap_or_else(|p| p.into_inner()).push(span);
}

/// Runs `f`, recording it as `name` (category `cat`) when recording.
pub fn span<T>(name: &str, cat: &'static str, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let start = Instant::now();
    let out = f();
    record(name, cat, start, Instant::now(), Value::Null);
    out
}

/// The trace-event JSON of `spans` (complete events, `ph: "X"`), with `process` and the
/// recording threads named, as process `pid` (e.g. the rank).
pub fn chrome_json(spans: &[Span], process: &str, pid: u64) -> Value {
    let mut events =
        vec![json!({ "ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": { "name": process } })];
    let threads = THREADS.lock().unwrap_or_else(|p| p.into_inner()).clone();
    for (id, name) in threads.iter().filter(|(id, _)| spans.iter().any(|s| s.thread == *id)) {
        events.push(json!({ "ph": "M", "name": "thread_name", "pid": pid, "tid": id, "args": { "name": name } }));
    }
    for s in spans {
        events.push(json!({ "ph": "X", "name": s.name, "cat": s.cat, "pid": pid, "tid": s.thread, "ts": s.start_us, "dur": s.dur_us, "args": s.args }));
    }
    json!({ "traceEvents": events, "displayTimeUnit": "ms" })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn records_only_while_on_and_writes_trace_events() {
        let t0 = Instant::now();
        record("before", "phase", t0, t0, Value::Null);
        start();
        let a = Instant::now();
        std::thread::sleep(Duration::from_millis(2));
        record("forward", "phase", a, Instant::now(), json!({ "step": 3 }));
        std::thread::Builder::new()
            .name("comm".into())
            .spawn(|| record("all-reduce bucket 0", "comm", Instant::now(), Instant::now(), json!({ "bytes": 8 })))
            .unwrap()
            .join()
            .unwrap();
        let spans = stop();
        record("after", "phase", t0, t0, Value::Null);
        assert_eq!(spans.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["forward", "all-reduce bucket 0"]);
        assert!(spans[0].dur_us >= 2000.0, "{:?}", spans[0]);
        assert_ne!(spans[0].thread, spans[1].thread);
        let json = chrome_json(&spans, "rank 0", 0);
        let events = json["traceEvents"].as_array().unwrap();
        let complete: Vec<_> = events.iter().filter(|e| e["ph"] == "X").collect();
        assert_eq!(complete.len(), 2);
        assert_eq!(complete[0]["args"]["step"], 3);
        assert!(events.iter().any(|e| e["name"] == "thread_name" && e["args"]["name"] == "comm"), "{json}");
        assert!(stop().is_empty());
    }
}
