//! The process's log output: one buffer in memory, one thread that writes
//! it to stderr.
//!
//! The gateway writes a line per request by default, so a `write(2)` per
//! line was a system call on every request, and a slow stderr (a full
//! pipe, a stalled log collector) stalled the request that logged. Lines
//! are instead appended to one shared buffer (a lock and a copy: no
//! allocation, no system call, no wake-up) and the writer thread hands the
//! buffer to stderr in one write every [`FLUSH_EVERY`], or as soon as
//! [`FLUSH_AT`] bytes wait. Every line of the process goes through the
//! same buffer — `tracing`'s events and the gateway's hand-written request
//! lines alike — so the order of lines is the order they were logged in.
//!
//! Bounded: at most [`MAX_PENDING`] bytes wait. A line that would pass
//! that (stderr has not taken anything for a while) is dropped and
//! counted, never waited for; once stderr takes lines again the writer
//! says how many, as a `tracing` warning (so in the log's own format, JSON
//! included, and only where the log's filter lets warnings through), and
//! the count is exported as `idemgate_log_lines_dropped_total` either way.
//!
//! What is lost: on SIGKILL or an abort, the lines of the last
//! [`FLUSH_EVERY`] at most. A normal exit flushes ([`Flush`]), and so does
//! binding a listener ([`flush`]): what a process logged while starting is
//! on stderr before any client can connect. A normal exit waits at most
//! [`FINAL_WAIT`] for stderr to take the rest: a stderr that nobody reads
//! (a full pipe) loses what still waits, and no longer keeps the process
//! from exiting; lines logged after that are dropped, not written.

use std::io::Write;
use std::sync::{Arc, Condvar, LazyLock, Mutex, MutexGuard, OnceLock, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use prometheus::IntCounter;

/// The longest a line waits in the buffer.
pub const FLUSH_EVERY: Duration = Duration::from_millis(100);
/// Bytes waiting that wake the writer at once.
pub const FLUSH_AT: usize = 64 * 1024;
/// Bytes that may wait at most; lines beyond are dropped and counted.
pub const MAX_PENDING: usize = 4 * 1024 * 1024;
/// The longest an exit waits for stderr to take the lines still waiting.
pub const FINAL_WAIT: Duration = Duration::from_secs(5);

static SINK: OnceLock<Sink> = OnceLock::new();

/// `idemgate_log_lines_dropped_total`: registered by [`crate::metrics`].
pub static DROPPED: LazyLock<IntCounter> = LazyLock::new(|| {
    IntCounter::new("idemgate_log_lines_dropped_total", "Log lines dropped because stderr did not keep up.")
        .expect("static metric definition")
});

/// The shared buffer (a handle: clones append to the same one).
#[derive(Clone)]
pub struct Sink {
    shared: Arc<Shared>,
}

struct Shared {
    state: Mutex<State>,
    wake: Condvar,
    /// Signalled when the writer thread has written its last batch.
    done: Condvar,
    /// Held while a batch is taken and written: one writer at a time.
    output: Mutex<()>,
}

#[derive(Default)]
struct State {
    pending: Vec<u8>,
    /// Lines dropped since the writer last said so.
    dropped: u64,
    closed: bool,
    /// The writer thread has written its last batch and returned.
    finished: bool,
    /// The exit stopped waiting for a writer stuck on stderr.
    abandoned: bool,
}

/// Flushes the buffer and stops the writer when dropped: hold it for the
/// life of the process.
#[must_use = "dropping it stops the log writer"]
pub struct Flush {
    sink: Sink,
    writer: Option<JoinHandle<()>>,
}

/// Starts the writer thread and makes its sink the process's (the one
/// [`write`] appends to); `None` if one is installed already or the thread
/// cannot start (the caller then writes to stderr directly).
pub fn start() -> Option<(Sink, Flush)> {
    let sink = Sink::new();
    SINK.set(sink.clone()).ok()?;
    let shared = sink.shared.clone();
    let writer =
        std::thread::Builder::new().name("idemgate-log".into()).spawn(move || write_out(&shared, std::io::stderr()));
    match writer {
        Ok(writer) => Some((sink.clone(), Flush { sink, writer: Some(writer) })),
        Err(_) => {
            // Nothing would ever write the buffer: lines go to stderr directly.
            let mut state = sink.shared.lock();
            (state.closed, state.finished) = (true, true);
            None
        }
    }
}

/// Appends whole lines to the process's sink, or writes them to stderr
/// when none was started (a failed write is dropped, as `tracing`'s own
/// writer drops it).
pub fn write(lines: &[u8]) {
    match SINK.get() {
        Some(sink) => sink.append(lines),
        None => {
            let _ = std::io::stderr().write_all(lines);
        }
    }
}

impl Sink {
    fn new() -> Self {
        let (wake, done) = (Condvar::new(), Condvar::new());
        Self { shared: Arc::new(Shared { state: Mutex::default(), wake, done, output: Mutex::new(()) }) }
    }

    /// Appends whole lines (newline included); drops them, counted, when
    /// [`MAX_PENDING`] bytes wait already. Until the writer has written its
    /// last batch, lines wait for it (also while it writes the rest at
    /// exit); after that they go to stderr directly (or, when the exit gave
    /// up on a stuck stderr, are dropped).
    pub fn append(&self, lines: &[u8]) {
        let mut state = self.shared.lock();
        if state.abandoned {
            state.dropped += 1;
            DROPPED.inc();
            return;
        }
        if state.finished {
            drop(state);
            let _ = std::io::stderr().write_all(lines);
            return;
        }
        if state.pending.len() + lines.len() > MAX_PENDING {
            state.dropped += 1;
            DROPPED.inc();
            return;
        }
        let before = state.pending.len();
        state.pending.extend_from_slice(lines);
        // Only the append that crosses the mark wakes the writer.
        if before < FLUSH_AT && state.pending.len() >= FLUSH_AT {
            self.shared.wake.notify_one();
        }
    }
}

/// The writer thread: takes the whole buffer every [`FLUSH_EVERY`] (or
/// when woken) and writes it outside the buffer's lock, until closed and
/// empty.
fn write_out(shared: &Shared, mut out: impl Write) {
    let mut batch = Vec::new();
    loop {
        {
            let state = shared.lock();
            if state.pending.len() < FLUSH_AT && !state.closed {
                drop(shared.wake.wait_timeout(state, FLUSH_EVERY).unwrap_or_else(PoisonError::into_inner));
            }
        }
        let closed = shared.write_pending(&mut batch, &mut out);
        let mut state = shared.lock();
        if closed && state.pending.is_empty() {
            state.finished = true;
            shared.done.notify_all();
            return;
        }
    }
}

/// Writes every line appended so far to stderr before returning (the
/// writer thread's batches included, in order). Called before a listener
/// is bound, so that what a process logged while starting is on stderr
/// by the time it accepts connections, whatever happens to it next.
pub fn flush() {
    if let Some(sink) = SINK.get() {
        sink.shared.write_pending(&mut Vec::new(), &mut std::io::stderr());
    }
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Takes the buffer and writes it (and the count of lines dropped)
    /// to `out`; whether the sink is closed. One writer at a time, and the
    /// buffer is taken under the same turn, so batches come out in order.
    /// Lines dropped since the last call are reported by a warning, which
    /// goes into the buffer like any event (its lock is not held here; only
    /// the turn is, which appending never takes) and out with the next batch.
    fn write_pending(&self, batch: &mut Vec<u8>, out: &mut impl Write) -> bool {
        let _turn = self.output.lock().unwrap_or_else(PoisonError::into_inner);
        let (dropped, closed) = {
            let mut state = self.lock();
            std::mem::swap(&mut state.pending, batch);
            (std::mem::take(&mut state.dropped), state.closed)
        };
        // A failed write is dropped, as tracing's own writer drops it.
        let _ = out.write_all(batch);
        let _ = out.flush();
        batch.clear();
        if dropped > 0 {
            tracing::warn!(lines = dropped, "log lines dropped: the log output did not keep up");
        }
        closed
    }
}

impl Drop for Flush {
    /// Closes the buffer and waits, at most [`FINAL_WAIT`], for the writer
    /// to write what waits; a writer still stuck on stderr then is left
    /// behind (the process ends it by exiting).
    fn drop(&mut self) {
        let shared = &self.sink.shared;
        let mut state = shared.lock();
        state.closed = true;
        shared.wake.notify_one();
        let (mut state, _) =
            shared.done.wait_timeout_while(state, FINAL_WAIT, |s| !s.finished).unwrap_or_else(PoisonError::into_inner);
        if !state.finished {
            state.abandoned = true;
            return;
        }
        drop(state);
        if let Some(writer) = self.writer.take() {
            let _ = writer.join();
        }
    }
}

/// `tracing_subscriber`'s writer: each event, formatted, is appended whole.
impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Sink {
    type Writer = EventWriter<'a>;

    fn make_writer(&'a self) -> Self::Writer {
        EventWriter { sink: self, line: Vec::new() }
    }
}

/// One event's bytes, appended to the sink when the event is done.
pub struct EventWriter<'a> {
    sink: &'a Sink,
    line: Vec<u8>,
}

impl Write for EventWriter<'_> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.line.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Drop for EventWriter<'_> {
    fn drop(&mut self) {
        if !self.line.is_empty() {
            self.sink.append(&self.line);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer the test can read back.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl Write for Captured {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(bytes);
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn lines_come_out_in_order_and_all_of_them_are_written_before_the_writer_stops() {
        let sink = Sink::new();
        let captured = Captured::default();
        let writer = {
            let (shared, out) = (sink.shared.clone(), captured.clone());
            std::thread::spawn(move || write_out(&shared, out))
        };
        let expected: Vec<u8> = (0..20_000).flat_map(|n| format!("line {n}\n").into_bytes()).collect();
        for line in expected.split_inclusive(|b| *b == b'\n') {
            sink.append(line);
        }
        sink.shared.lock().closed = true;
        sink.shared.wake.notify_one();
        writer.join().unwrap();
        assert_eq!(*captured.0.lock().unwrap(), expected);
    }

    #[test]
    fn a_full_buffer_drops_lines_and_the_writer_says_how_many() {
        let sink = Sink::new();
        let line = vec![b'x'; 1023].into_iter().chain([b'\n']).collect::<Vec<u8>>();
        // No writer yet: the buffer fills to its bound, then drops.
        for _ in 0..(MAX_PENDING / line.len() + 3) {
            sink.append(&line);
        }
        assert_eq!(sink.shared.lock().pending.len(), MAX_PENDING);
        assert_eq!(sink.shared.lock().dropped, 3);
        sink.shared.lock().closed = true;
        let captured = Captured::default();
        // The count is a warning in the log's own format, written after the
        // batch it could not hold (also at exit: the writer writes it before
        // it stops).
        let json = tracing_subscriber::fmt().json().with_writer(sink.clone()).finish();
        tracing::subscriber::with_default(json, || write_out(&sink.shared, captured.clone()));
        let written = captured.0.lock().unwrap();
        let (kept, notice) = written.split_at(MAX_PENDING);
        assert!(kept.iter().all(|b| *b == b'x' || *b == b'\n'));
        let notice: serde_json::Value = serde_json::from_slice(notice).expect("one JSON line");
        assert_eq!(notice["level"], "WARN");
        assert_eq!(notice["fields"]["message"], "log lines dropped: the log output did not keep up");
        assert_eq!(notice["fields"]["lines"], 3);
    }
}
