//! Panics of the libraries that read files, turned into errors. Burn panics when a record does
//! not fit the module it is loaded into ("Can't parse record from a different variant"), and a
//! decoder may panic on bytes crafted against it; whatever is read from disk must end in a
//! one-line error instead. The panic's message becomes the error's reason and is not printed.

use burn::record::RecorderError;
use std::cell::Cell;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::Once;

thread_local! {
    /// Set while this thread runs a guarded call: its panics are returned, not printed.
    static GUARDED: Cell<bool> = const { Cell::new(false) };
}

static QUIET_HOOK: Once = Once::new();

/// Runs `f`; a panic inside it becomes `Err(message)`.
///
/// # Errors
/// The panic's message when `f` panics.
pub fn catch_panic<T>(f: impl FnOnce() -> T) -> Result<T, String> {
    QUIET_HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if !GUARDED.with(Cell::get) {
                previous(info);
            }
        }));
    });
    let outer = GUARDED.with(|g| g.replace(true));
    let result = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(outer));
    result.map_err(|payload| {
        let text = payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_string()));
        text.unwrap_or_else(|| "the library panicked".into()).lines().next().unwrap_or_default().to_string()
    })
}

/// Runs a recorder's decoding; a panic inside it becomes its `DeserializeError`.
///
/// # Errors
/// The recorder's error, or the panic's message as one.
pub fn decode<R>(f: impl FnOnce() -> Result<R, RecorderError>) -> Result<R, RecorderError> {
    catch_panic(f).unwrap_or_else(|p| Err(RecorderError::DeserializeError(p)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_panic_becomes_its_message_and_values_pass_through() {
        assert_eq!(catch_panic(|| 7), Ok(7));
        assert_eq!(
            catch_panic(|| -> u8 { panic!("record of another variant\nsecond line") }),
            Err("record of another variant".into())
        );
        let n = 3;
        assert_eq!(catch_panic(|| -> u8 { panic!("got {n}") }), Err("got 3".into()));
        assert_eq!(catch_panic(|| catch_panic(|| -> u8 { panic!("inner") })), Ok(Err("inner".into())));
    }
}
