//! A server's wall clock the test can step: the server runs under
//! libfaketime (Debian's `libfaketime`, preloaded), which reads the clock's
//! offset from a file on every time call, so writing the file steps the
//! server's clock while it runs.
//!
//! libfaketime intercepts the C library's time calls, so this works for
//! servers that read the clock through libc (SecantusDB, on CPython). Go
//! programs (etcd, nats-server) read it through the vDSO and raw system
//! calls, which a preloaded library cannot reach: their clocks cannot be
//! stepped this way. The monotonic clock is stepped along with the wall
//! clock: libfaketime 0.9.10 fails the server's sleeps (EINVAL) when told to
//! leave it alone.
//!
//! A threaded server reads the true time now and then instead of the
//! stepped one. With `FAKETIME_NO_CACHE`, libfaketime 0.9.10 opens the file
//! on every clock call, its path formatted into a buffer every thread
//! shares; formatting writes a NUL at its start first, so a thread that
//! opens the path at that instant opens "", finds no file and falls back to
//! no offset at all. A SecantusDB under 12 busy connections, its clock
//! stepped 3.25 s back and left there, answered 8 of 16,599 `$$NOW`s
//! 3.25 s ahead (each at the true time); 20 threads of a C program calling
//! `clock_gettime` saw 97 of 604,160 calls at the true time, one thread
//! none. The clock of a threaded server (SecantusDB: a thread per
//! connection) says so ([`ServerClock::reads_true_time`]), and the fault
//! runs keep its steps within the deadline slack of the true time.
//! PostgreSQL (a single-threaded process per connection) and Redis (its
//! commands, and their clock, on its main thread) are not marked.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::Duration;

use super::process::TempDir;

/// Where Debian's `libfaketime` package puts the library.
const LIBFAKETIME: &[&str] = &[
    "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/aarch64-linux-gnu/faketime/libfaketime.so.1",
    "/usr/lib/faketime/libfaketime.so.1",
];

/// The preloadable libfaketime: the copy `cargo xtask provision` keeps in
/// the servers directory (`lib/libfaketime.so.1`), else the system's.
pub fn libfaketime() -> Option<PathBuf> {
    std::iter::once(super::servers_dir().join("lib").join("libfaketime.so.1"))
        .chain(LIBFAKETIME.iter().map(PathBuf::from))
        .find(|p| p.is_file())
}

/// The clock offset of one server started under libfaketime.
#[derive(Debug)]
pub struct ServerClock {
    file: PathBuf,
    offset_ms: Mutex<i64>,
    /// Whether the server may read the true time now and then (a threaded
    /// server; see the module docs).
    reads_true_time: bool,
    /// The directory of the file, removed with the clock.
    dir: Option<TempDir>,
}

impl ServerClock {
    /// A clock at offset zero, kept in `dir`; the environment to start the
    /// server with.
    pub(crate) fn new(dir: &Path) -> io::Result<(ServerClock, Vec<(String, String)>)> {
        let lib = libfaketime().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotFound,
                "libfaketime is missing (run `cargo xtask provision`, which fetches Debian's libfaketime)",
            )
        })?;
        let clock = ServerClock {
            file: dir.join("faketime"),
            offset_ms: Mutex::new(0),
            reads_true_time: false,
            dir: None,
        };
        clock.write(0)?;
        let env = vec![
            ("LD_PRELOAD".to_string(), lib.display().to_string()),
            (
                "FAKETIME_TIMESTAMP_FILE".to_string(),
                clock.file.display().to_string(),
            ),
            // Read the file on every call, so a step takes effect at once.
            ("FAKETIME_NO_CACHE".to_string(), "1".to_string()),
        ];
        Ok((clock, env))
    }

    /// The clock, owning the directory its file is in.
    pub(crate) fn keeping(mut self, dir: TempDir) -> ServerClock {
        self.dir = Some(dir);
        self
    }

    /// The clock of a threaded server, which may read the true time now
    /// and then instead of the stepped one (see the module docs).
    pub(crate) fn in_threaded_server(mut self) -> ServerClock {
        self.reads_true_time = true;
        self
    }

    /// Whether the server may read the true time now and then instead of
    /// the stepped one: each reading is then either the stepped clock or
    /// the true time (see the module docs).
    pub fn reads_true_time(&self) -> bool {
        self.reads_true_time
    }

    /// Steps the server's clock by `by`, forward or backward, from where it
    /// stands.
    pub fn step(&self, by: Duration, forward: bool) -> io::Result<()> {
        let by = i64::try_from(by.as_millis()).unwrap_or(i64::MAX);
        let mut offset = self.offset_ms.lock().unwrap_or_else(|p| p.into_inner());
        let next = if forward {
            offset.saturating_add(by)
        } else {
            offset.saturating_sub(by)
        };
        self.write(next)?;
        *offset = next;
        Ok(())
    }

    /// How far the server's clock is from the real one, in milliseconds
    /// (negative: behind).
    pub fn offset_ms(&self) -> i64 {
        *self.offset_ms.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Writes the offset as libfaketime reads it (`+1.250s`), by rename so
    /// the server never reads half a file.
    fn write(&self, offset_ms: i64) -> io::Result<()> {
        let sign = if offset_ms < 0 { '-' } else { '+' };
        let abs = offset_ms.unsigned_abs();
        let text = format!("{sign}{}.{:03}s\n", abs / 1000, abs % 1000);
        let tmp = self.file.with_extension("new");
        std::fs::write(&tmp, text)?;
        std::fs::rename(&tmp, &self.file)
    }
}
