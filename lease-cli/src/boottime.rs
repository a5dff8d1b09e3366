//! Deadlines on `CLOCK_BOOTTIME`, for the watchdog.
//!
//! The lease's deadline is counted on the monotonic clock, from the instant
//! its last successful renewal was *sent*. The monotonic clock stops while
//! the machine is suspended; the backend's clock does not, so the watchdog
//! counts on `CLOCK_BOOTTIME`, which runs on through a suspend.
//!
//! The two clocks differ by an offset that grows by the length of every
//! suspend, and never otherwise (both are slewed alike). Mapping a deadline
//! with the offset of *now* is wrong when a suspend fell between the send
//! and now: a renewal sent before a suspend and answered after it would get
//! a deadline late by the suspend's length. So the mapping uses the offset
//! as it was at the send: [`BootClock`] samples the pair of clocks every
//! [`SAMPLE_EVERY`] and maps an instant sent at `s` with the latest sample
//! taken no later than `s`. As the offset never shrinks, that sample's
//! offset is at most the one at `s`: the mapped deadline is never late. It
//! is early by any suspend that began between that sample and the send (at
//! most [`SAMPLE_EVERY`] before it), which only stops the command sooner.
//! Each sample reads `CLOCK_BOOTTIME` before the monotonic clock, so the
//! time between the two reads also errs early.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rustix::time::{clock_gettime, ClockId};
use tokio::time::Instant;

/// How often the pair of clocks is sampled.
pub const SAMPLE_EVERY: Duration = Duration::from_millis(20);

/// An offset change below this is read noise, not a suspend.
const NOISE: Duration = Duration::from_millis(1);

/// The most offsets kept while nothing is mapped (one per suspend).
const MAX_RUNS: usize = 256;

/// Nanoseconds of `CLOCK_BOOTTIME` now.
pub fn boot_now() -> u128 {
    let t = clock_gettime(ClockId::Boottime);
    u128::try_from(t.tv_sec)
        .unwrap_or(0)
        .saturating_mul(1_000_000_000)
        .saturating_add(u128::try_from(t.tv_nsec).unwrap_or(0))
}

/// One sample: `CLOCK_BOOTTIME` (ns) and the monotonic instant.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Sample {
    boot: u128,
    at: Instant,
}

impl Sample {
    fn now() -> Sample {
        // Boot time first: the later monotonic read makes the offset err
        // small, i.e. early.
        let boot = boot_now();
        Sample {
            boot,
            at: Instant::now(),
        }
    }

    /// `t` on `CLOCK_BOOTTIME` with this sample's offset (`t` not before it).
    fn map(&self, t: Instant) -> u128 {
        self.boot
            .saturating_add(t.saturating_duration_since(self.at).as_nanos())
    }

    /// As [`Sample::map`], for a `t` on either side of the sample.
    fn map_any(&self, t: Instant) -> u128 {
        if t >= self.at {
            self.map(t)
        } else {
            self.boot
                .saturating_sub(self.at.saturating_duration_since(t).as_nanos())
        }
    }
}

/// The offsets seen, each as the first sample that had it (oldest first).
#[derive(Debug, Default)]
struct Offsets {
    runs: Vec<Sample>,
}

impl Offsets {
    fn record(&mut self, s: Sample) {
        match self.runs.last() {
            // The same offset as the current run's first sample (to within
            // read noise): nothing new.
            Some(last)
                if s.at >= last.at && s.boot <= last.map(s.at).saturating_add(NOISE.as_nanos()) => {
            }
            _ => {
                self.runs.push(s);
                if self.runs.len() > MAX_RUNS {
                    // Merging a run into the one before it gives its span
                    // the smaller, earlier offset: early, never late.
                    self.runs.remove(1);
                }
            }
        }
    }

    /// `t` on `CLOCK_BOOTTIME`, for a deadline counted from `sent`.
    fn map(&mut self, sent: Instant, t: Instant) -> Option<u128> {
        let i = self.runs.iter().rposition(|s| s.at <= sent)?;
        // Later sends come later: the runs before this one are not needed.
        self.runs.drain(..i);
        self.runs.first().map(|s| s.map(t))
    }
}

/// Samples the monotonic clock and `CLOCK_BOOTTIME` together, to map a
/// lease's deadlines with the offset the clocks had when the renewal was
/// sent. Start it before acquiring; it samples until dropped.
pub struct BootClock {
    offsets: Arc<Mutex<Offsets>>,
    sampler: tokio::task::JoinHandle<()>,
}

impl BootClock {
    /// Takes a first sample now and samples every [`SAMPLE_EVERY`] from
    /// then on (in the current tokio runtime).
    pub fn start() -> BootClock {
        let offsets = Arc::new(Mutex::new(Offsets::default()));
        lock(&offsets).record(Sample::now());
        let weak = Arc::downgrade(&offsets);
        let sampler = tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let Some(offsets) = weak.upgrade() else {
                    return;
                };
                lock(&offsets).record(Sample::now());
            }
        });
        BootClock { offsets, sampler }
    }

    /// `t` (a deadline counted from a request sent at `sent`) on
    /// `CLOCK_BOOTTIME`, in nanoseconds: never later than `t` is, and
    /// early by a suspend that began at most [`SAMPLE_EVERY`] before the
    /// send.
    pub fn map(&self, sent: Instant, t: Instant) -> u128 {
        let mut offsets = lock(&self.offsets);
        offsets.record(Sample::now());
        // A send before the first sample (not one of `lease`'s, which
        // starts sampling before it acquires): the first offset is the
        // nearest there is.
        match offsets.map(sent, t) {
            Some(b) => b,
            None => offsets
                .runs
                .first()
                .copied()
                .unwrap_or_else(Sample::now)
                .map_any(t),
        }
    }
}

impl Drop for BootClock {
    fn drop(&mut self) {
        self.sampler.abort();
    }
}

fn lock(m: &Mutex<Offsets>) -> MutexGuard<'_, Offsets> {
    // A few assignments that cannot panic halfway.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u128 = 1_000_000_000;

    /// A renewal sent before a 30 s suspend and answered after it: its
    /// deadline on `CLOCK_BOOTTIME` is counted from the send, not moved
    /// 30 s late by the suspend.
    #[test]
    fn a_suspend_between_send_and_answer_does_not_move_the_deadline() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut o = Offsets::default();
        // Before the send: monotonic and boot time agree (offset 1000 s).
        o.record(Sample {
            boot: 1000 * S,
            at: at(0),
        });
        o.record(Sample {
            boot: 1000 * S + 20_000_000,
            at: at(20),
        });
        let sent = at(30);
        // 30 s asleep: boot time jumps, the monotonic clock does not.
        o.record(Sample {
            boot: 1030 * S + 40_000_000,
            at: at(40),
        });
        let deadline = sent + Duration::from_secs(2);
        // 1000 s + 30 ms + 2 s: as if no suspend had happened, since the
        // backend's clock counted the suspend.
        let mapped = o.map(sent, deadline).unwrap();
        assert_eq!(mapped, 1000 * S + 2_030_000_000);
        // Mapping with the offset of the sample after the send (what a
        // mapping with the offset of now does) is 30 s late.
        assert_eq!(
            Sample {
                boot: 1030 * S + 40_000_000,
                at: at(40)
            }
            .map(deadline),
            mapped + 30 * S
        );
        // A renewal sent after the suspend gets the new offset.
        let later = at(50);
        assert_eq!(
            o.map(later, later + Duration::from_secs(2)).unwrap(),
            1030 * S + 2_050_000_000
        );
    }

    #[test]
    fn read_noise_does_not_make_runs_and_never_errs_late() {
        let t0 = Instant::now();
        let mut o = Offsets::default();
        for i in 0..100u64 {
            // An offset that wobbles below a millisecond.
            o.record(Sample {
                boot: 5 * S + u128::from(i) * 20_000_000 + u128::from(i % 3) * 100_000,
                at: t0 + Duration::from_millis(20 * i),
            });
        }
        assert_eq!(o.runs.len(), 1);
        let sent = t0 + Duration::from_millis(500);
        assert_eq!(o.map(sent, sent).unwrap(), 5 * S + 500_000_000);
    }

    #[test]
    fn many_suspends_keep_a_bounded_and_early_record() {
        let t0 = Instant::now();
        let mut o = Offsets::default();
        for i in 0..1000u64 {
            o.record(Sample {
                boot: u128::from(i) * 10 * S,
                at: t0 + Duration::from_millis(i),
            });
        }
        assert!(o.runs.len() <= MAX_RUNS);
        let sent = t0 + Duration::from_millis(500);
        // The true value is 5000 s; merged runs may only err early.
        assert!(o.map(sent, sent).unwrap() <= 5000 * S);
    }

    #[tokio::test]
    async fn the_clock_maps_now_to_about_now() {
        let c = BootClock::start();
        tokio::time::sleep(SAMPLE_EVERY * 3).await;
        let sent = Instant::now();
        let mapped = c.map(sent, sent + Duration::from_secs(5));
        let expect = boot_now() + 5 * S;
        assert!(
            mapped <= expect && expect - mapped < 100_000_000,
            "{mapped} vs {expect}"
        );
    }
}
