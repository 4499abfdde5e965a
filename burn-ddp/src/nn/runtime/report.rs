//! Which implementation a layer kind runs (cuDNN, our kernels, burn's), logged once per process.

use std::sync::OnceLock;

/// Records, once per process, which implementation convolutions use, and logs it. Called on
/// every convolution: after the first, it only reads a flag (`path` is not evaluated).
pub(crate) fn note_path(path: impl FnOnce() -> String) {
    static PATH: OnceLock<String> = OnceLock::new();
    if PATH.get().is_none() {
        let path = path();
        if PATH.set(path.clone()).is_ok() {
            log::info!("convolutions: {path}");
        }
    }
}
