//! `bench --host-profile DIR`: where the host's time goes, per thread. Small-batch steps are
//! host-bound (the training thread, burn-fusion's and cubecl's device threads each busy for the
//! whole run), and their CPU clocks cannot say which thread does useful work: cubecl's threads
//! spin while they wait. Sampling every thread's stack (pprof: SIGPROF at ~1 kHz of process CPU
//! time) can: it writes DIR/host-profile.svg (a flame graph, one tower per thread),
//! DIR/host-profile.folded (the same stacks as text) and DIR/host-profile.txt (per thread, the
//! functions holding the most samples, inclusive and at the top of the stack, and the crates).
//! Needs a binary built with `--features host-profile` and its symbol table (release keeps it).

use crate::error::{Error, Result};
use std::path::{Path, PathBuf};

/// A running profile of every host thread; [`HostProfile::finish`] writes it.
pub struct HostProfile {
    #[cfg(feature = "host-profile")]
    guard: pprof::ProfilerGuard<'static>,
    dir: PathBuf,
}

impl HostProfile {
    /// Starts sampling every thread of the process.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the binary was built without the `host-profile` feature or
    /// the profiler cannot start; [`Error::Io`] when `dir` cannot be created.
    pub fn start(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|source| Error::Io {
            action: "creating",
            path: dir.to_path_buf(),
            source,
        })?;
        Self::sample(dir).map_err(|reason| Error::InvalidConfig {
            name: "--host-profile",
            value: dir.display().to_string(),
            reason,
        })
    }

    #[cfg(feature = "host-profile")]
    fn sample(dir: &Path) -> std::result::Result<Self, String> {
        let guard = pprof::ProfilerGuardBuilder::default()
            .frequency(997)
            .blocklist(&["libc", "libgcc", "pthread", "vdso"])
            .build()
            .map_err(|e| format!("the profiler did not start: {e}"))?;
        Ok(Self { guard, dir: dir.to_path_buf() })
    }

    #[cfg(not(feature = "host-profile"))]
    fn sample(_dir: &Path) -> std::result::Result<Self, String> {
        Err("this binary was built without the profiler; rebuild with `cargo build --release -p burn-vision --features host-profile`".into())
    }

    /// Stops sampling and writes the flame graph, the folded stacks and the summary; returns
    /// the summary's path.
    ///
    /// # Errors
    /// [`Error::Io`] when a file cannot be written.
    #[cfg(feature = "host-profile")]
    pub fn finish(self) -> Result<PathBuf> {
        let report = self.guard.report().build().map_err(|e| Error::InvalidConfig {
            name: "--host-profile",
            value: self.dir.display().to_string(),
            reason: format!("the profile could not be read: {e}"),
        })?;
        let stacks: Vec<Stack> = report
            .data
            .iter()
            .map(|(frames, &n)| Stack {
                thread: thread_group(&frames.thread_name_or_id()),
                leaf_first: frames
                    .frames
                    .iter()
                    .map(|f| f.first().map_or_else(|| "?".into(), |s| short_name(&s.name())))
                    .collect(),
                samples: n.max(0) as u64,
            })
            .collect();
        let write = |name: &str, bytes: &[u8]| crate::atomic_file::write_atomic(&self.dir.join(name), bytes);
        let mut svg = Vec::new();
        if report.flamegraph(&mut svg).is_ok() {
            write("host-profile.svg", &svg)?;
        }
        write("host-profile.folded", folded(&stacks).as_bytes())?;
        write("host-profile.txt", summarise(&stacks, 25).as_bytes())?;
        Ok(self.dir.join("host-profile.txt"))
    }

    /// Without the profiler nothing was sampled ([`HostProfile::start`] refuses first).
    ///
    /// # Errors
    /// Never.
    #[cfg(not(feature = "host-profile"))]
    pub fn finish(self) -> Result<PathBuf> {
        Ok(self.dir)
    }
}

/// One sampled stack: its thread, its frames from the innermost out, how often it was seen.
#[derive(Debug, Clone)]
pub struct Stack {
    /// The thread's name (numbered pools folded into one name).
    pub thread: String,
    /// Function names, innermost first.
    pub leaf_first: Vec<String>,
    /// Samples with exactly this stack.
    pub samples: u64,
}

/// Threads of one pool under one name (`rayon-3` → `rayon-*`), so their samples add up.
#[cfg_attr(not(feature = "host-profile"), allow(dead_code))]
fn thread_group(name: &str) -> String {
    let stem = name.trim_end_matches(|c: char| c.is_ascii_digit());
    if stem.len() < name.len() && stem.ends_with(['-', '_']) { format!("{stem}*") } else { name.to_string() }
}

/// A demangled name without its hash and with generic arguments below the first level
/// elided: `<burn_fusion::Fusion<B> as Backend>::float_add::h0123…` →
/// `<burn_fusion::Fusion<…> as Backend>::float_add`.
pub fn short_name(name: &str) -> String {
    let name = match name.rfind("::h") {
        Some(i) if name.len() - i == 19 && name[i + 3..].chars().all(|c| c.is_ascii_hexdigit()) => &name[..i],
        _ => name,
    };
    let keep_depth = usize::from(name.starts_with('<'));
    let (mut out, mut depth) = (String::with_capacity(name.len()), 0usize);
    for c in name.chars() {
        match c {
            '<' => {
                depth += 1;
                if depth == keep_depth + 1 {
                    out.push_str("<…");
                } else if depth <= keep_depth {
                    out.push(c);
                }
            }
            '>' if depth > 0 => {
                if depth <= keep_depth {
                    out.push(c);
                } else if depth == keep_depth + 1 {
                    out.push('>');
                }
                depth -= 1;
            }
            _ if depth <= keep_depth => out.push(c),
            _ => {}
        }
    }
    out
}

/// The crate a name belongs to: its first path segment (`<a::B as c::D>::f` → `a`).
pub fn crate_of(name: &str) -> &str {
    let name = name.trim_start_matches('<');
    name.split([':', '<', ' ']).next().filter(|s| !s.is_empty()).unwrap_or("?")
}

/// The stacks as flame-graph tools read them: `thread;outer;…;inner count`, one per line.
pub fn folded(stacks: &[Stack]) -> String {
    let mut lines: Vec<String> = stacks
        .iter()
        .map(|s| {
            format!(
                "{};{} {}",
                s.thread,
                s.leaf_first.iter().rev().map(String::as_str).collect::<Vec<_>>().join(";"),
                s.samples
            )
        })
        .collect();
    lines.sort();
    lines.join("\n") + "\n"
}

/// Per thread, busiest first: its samples, then the `top` functions by inclusive samples (each
/// counted once per stack) and by samples at the top of the stack, and the crates by the latter.
pub fn summarise(stacks: &[Stack], top: usize) -> String {
    use std::collections::{BTreeMap, HashSet};
    let mut threads: BTreeMap<&str, Vec<&Stack>> = BTreeMap::new();
    for s in stacks {
        threads.entry(&s.thread).or_default().push(s);
    }
    let total: u64 = stacks.iter().map(|s| s.samples).sum();
    let mut order: Vec<(&str, u64)> = threads.iter().map(|(t, v)| (*t, v.iter().map(|s| s.samples).sum())).collect();
    order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
    let mut out = format!("host profile: {total} samples in all (~1 ms of CPU each)\n");
    for (thread, n) in order {
        let (mut inclusive, mut leaf, mut crates) =
            (BTreeMap::<&str, u64>::new(), BTreeMap::<&str, u64>::new(), BTreeMap::<&str, u64>::new());
        for s in &threads[thread] {
            for f in s.leaf_first.iter().map(String::as_str).collect::<HashSet<_>>() {
                *inclusive.entry(f).or_default() += s.samples;
            }
            if let Some(f) = s.leaf_first.first() {
                *leaf.entry(f).or_default() += s.samples;
                *crates.entry(crate_of(f)).or_default() += s.samples;
            }
        }
        out += &format!("\n== thread {thread}: {n} samples ({:.1} %)\n", 100.0 * n as f64 / total.max(1) as f64);
        for (title, table) in [("inclusive", inclusive), ("top of stack", leaf), ("crates, top of stack", crates)] {
            out += &format!("-- {title}\n");
            let mut rows: Vec<(&str, u64)> = table.into_iter().collect();
            rows.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            for (name, k) in rows.into_iter().take(top) {
                out += &format!("{:6} {:5.1} %  {name}\n", k, 100.0 * k as f64 / n.max(1) as f64);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_lose_hashes_and_inner_generics() {
        assert_eq!(
            short_name("burn_fusion::stream::Stream<R>::run::h0123456789abcdef"),
            "burn_fusion::stream::Stream<…>::run"
        );
        assert_eq!(
            short_name("<burn_fusion::Fusion<B> as burn::Backend>::float_add::h0123456789abcdef"),
            "<burn_fusion::Fusion<…> as burn::Backend>::float_add"
        );
        assert_eq!(short_name("core::ptr::drop_in_place<alloc::vec::Vec<u8>>"), "core::ptr::drop_in_place<…>");
        assert_eq!(short_name("main::h12"), "main::h12", "not a hash: too short");
        assert_eq!(crate_of("<burn_fusion::Fusion<…> as burn::Backend>::float_add"), "burn_fusion");
        assert_eq!(crate_of("Unknown"), "Unknown");
    }

    #[test]
    fn summary_counts_each_function_once_per_stack_and_ranks_threads() {
        let stack = |thread: &str, frames: &[&str], samples| Stack {
            thread: thread_group(thread),
            leaf_first: frames.iter().map(|s| s.to_string()).collect(),
            samples,
        };
        let stacks = [
            stack("main", &["a::f", "a::g", "a::f", "main"], 3),
            stack("main", &["b::h", "main"], 1),
            stack("rayon-1", &["c::x"], 5),
            stack("rayon-2", &["c::x"], 2),
        ];
        let text = summarise(&stacks, 10);
        let rayon = text.find("== thread rayon-*: 7 samples (63.6 %)").expect("pooled threads added up, busiest first");
        let main = text.find("== thread main: 4 samples (36.4 %)").expect("main thread listed");
        assert!(rayon < main, "{text}");
        assert!(text.contains("     3  75.0 %  a::f\n"), "a::f appears twice in one stack, counted once:\n{text}");
        assert!(text.contains("     4 100.0 %  main\n"), "{text}");
        assert!(text.contains("     3  75.0 %  a\n"), "crate a holds the top of 3 samples:\n{text}");
        assert_eq!(folded(&stacks[..2]), "main;main;a::f;a::g;a::f 3\nmain;main;b::h 1\n");
    }
}
