//! What a run measures about itself besides its metrics: host time per step phase, CPU time per
//! thread, host profiles, Perfetto traces of steps, the per-rank health table and TensorBoard's
//! event files.

pub mod health;
pub mod host_profile;
pub mod phases;
pub mod tensorboard;
pub mod thread_clock;
pub mod trace;
