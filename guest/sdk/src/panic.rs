//! Panic messages to the agent's log: a trap alone says only "unreachable executed".

use core::fmt::{self, Write};
use core::sync::atomic::{AtomicBool, Ordering};

use crate::Level;

/// The longest panic message sent, in bytes; longer ones are cut.
const MAX_MESSAGE: usize = 1024;

/// Set while a panic is being reported: a panic inside the report (in a `Display` impl, or
/// an allocation failing) must not report again, or it would recurse until the stack is gone.
static REPORTING: AtomicBool = AtomicBool::new(false);

/// Logs `panic` (a `PanicInfo`, or std's `PanicHookInfo`) at level error, on one line.
/// Formats into a fixed buffer: the panic may be an allocation failure.
pub(crate) fn report(panic: &dyn fmt::Display) {
    if REPORTING.swap(true, Ordering::SeqCst) {
        return;
    }
    let mut line = Line {
        buf: [0; MAX_MESSAGE],
        len: 0,
    };
    // A full buffer ends the formatting with an error; what fitted is sent.
    let _ = write!(line, "{panic}");
    crate::log(Level::Error, line.as_str());
    REPORTING.store(false, Ordering::SeqCst);
}

struct Line {
    buf: [u8; MAX_MESSAGE],
    len: usize,
}

impl Line {
    fn as_str(&self) -> &str {
        // Only whole characters are ever copied in.
        core::str::from_utf8(&self.buf[..self.len]).unwrap_or("panicked")
    }
}

impl Write for Line {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        for c in s.chars() {
            // Rust puts the message on its own line after the location.
            let c = if c == '\n' { ' ' } else { c };
            let mut bytes = [0; 4];
            let encoded = c.encode_utf8(&mut bytes).as_bytes();
            let end = self.len + encoded.len();
            if end > self.buf.len() {
                return Err(fmt::Error);
            }
            self.buf[self.len..end].copy_from_slice(encoded);
            self.len = end;
        }
        Ok(())
    }
}
