//! Tracing carries key, holder and fence — never the payload.
//!
//! Tracing caches each callsite's interest process-wide, and a test running
//! beside this one without a subscriber could cache "never" for the spans it
//! looks for. So the capture is the process's global subscriber, installed
//! by [`install`] before any keeper runs (every `Rec` installs it), and this
//! test only looks at the lines of its own keys and holder.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::common::{key, Rec};
use lease_core::Payload;
use lease_fake::Fake;
use lease_keeper::{Keeper, LossReason};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Records every span and event as a line of `name field=value…`.
#[derive(Clone, Default)]
pub struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU64>,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, attrs: &Attributes<'_>) -> Id {
        let mut line = Line(format!("span {}", attrs.metadata().name()));
        attrs.record(&mut line);
        self.lines.lock().unwrap().push(line.0);
        Id::from_u64(self.next.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut line = Line("record".into());
        values.record(&mut line);
        self.lines.lock().unwrap().push(line.0);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line(format!("event {}", event.metadata().level()));
        event.record(&mut line);
        self.lines.lock().unwrap().push(line.0);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

/// The process-wide capture, installed as the global subscriber on first use.
pub fn install() -> &'static Capture {
    static CAPTURE: OnceLock<Capture> = OnceLock::new();
    CAPTURE.get_or_init(|| {
        let capture = Capture::default();
        // Fails only if another global subscriber was set, which nothing here does.
        let _ = tracing::subscriber::set_global_default(capture.clone());
        tracing::callsite::rebuild_interest_cache();
        capture
    })
}

#[tokio::test(start_paused = true)]
async fn tracing_names_key_holder_and_fence_but_never_the_payload() {
    let capture = install();
    let fake = Fake::new();
    let rec = Rec::new(fake.clone());
    let keeper = Keeper::new(rec.clone());
    let secret = "SECRET-PAYLOAD-7f3a";
    let k = key("obs/traced");
    let ttl = Duration::from_secs(3);
    let lease = keeper
        .try_acquire(&k)
        .ttl(ttl)
        .payload(Payload::new(secret.as_bytes().to_vec()).unwrap())
        .await
        .unwrap();
    lease.set_payload(Payload::new(format!("{secret}-2").into_bytes()).unwrap());
    tokio::time::sleep(ttl).await;
    fake.fail_next(1);
    tokio::time::sleep(ttl).await;
    lease.release().await.unwrap();

    let k2 = key("obs/lost");
    let lost = keeper.try_acquire(&k2).ttl(ttl).await.unwrap();
    fake.expire(&k2);
    assert_eq!(lost.lost().await, LossReason::Expired);
    drop(lost);

    // No test but this one has a payload like this one's: all lines count.
    let all = capture.lines.lock().unwrap().clone();
    let secret_lines: Vec<&String> = all.iter().filter(|l| l.contains("SECRET")).collect();
    assert!(
        secret_lines.is_empty(),
        "payload contents were logged:\n{secret_lines:?}"
    );
    // Only this test's lines: other tests log into the same capture.
    let lines: Vec<String> = all
        .into_iter()
        .filter(|l| l.contains(keeper.holder().as_str()))
        .collect();
    let text = lines.join("\n");
    let has = |what: &str, fence: bool| {
        lines.iter().any(|l| {
            l.contains(what)
                && l.contains(&format!("key={}", k.as_str()))
                && l.contains(&format!("holder={}", keeper.holder()))
                && (!fence || l.contains("fence=1"))
        })
    };
    assert!(has("span lease.acquire", false), "no acquire span:\n{text}");
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("span lease.acquire") && l.contains("backend=unnamed")),
        "the acquire span does not name the backend:\n{text}"
    );
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("span lease.keep") && l.contains("backend=unnamed")),
        "the keep span does not name the backend:\n{text}"
    );
    assert!(has("lease acquired", true), "no acquire event:\n{text}");
    assert!(has("lease renewed", true), "no renew event:\n{text}");
    assert!(
        has("renewal failed", true),
        "no renew-failure event:\n{text}"
    );
    assert!(has("lease released", true), "no release event:\n{text}");
    assert!(
        lines.iter().any(|l| l.contains("lease lost")
            && l.contains("obs/lost")
            && l.contains("fence=1")
            && l.contains("expired")),
        "no loss event:\n{text}"
    );
}

/// This test's event lines (those naming `holder`), as `(level, line)`.
fn events_of(capture: &Capture, holder: &str) -> Vec<(String, String)> {
    capture
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("event ") && l.contains(holder))
        .map(|l| {
            let level = l.split(' ').nth(1).unwrap_or_default().to_owned();
            (level, l.clone())
        })
        .collect()
}

#[tokio::test(start_paused = true)]
async fn the_first_failed_renewal_of_a_streak_warns_and_the_recovery_is_logged_once() {
    let capture = install();
    let fake = Fake::new();
    let keeper = Keeper::new(Rec::new(fake.clone()));
    let k = key("obs/streak");
    let ttl = Duration::from_secs(3);
    let lease = keeper.try_acquire(&k).ttl(ttl).await.unwrap();
    // Three renewal attempts fail in a row, then one succeeds.
    fake.fail_next(3);
    tokio::time::sleep(ttl).await;
    assert!(lease.may_write(), "lost during the streak");
    // A second streak warns again.
    fake.fail_next(1);
    tokio::time::sleep(ttl).await;
    lease.release().await.unwrap();

    let events = events_of(capture, keeper.holder().as_str());
    let text = events
        .iter()
        .map(|(_, l)| l.as_str())
        .collect::<Vec<_>>()
        .join("\n");
    let at = |level: &str, what: &str| {
        events
            .iter()
            .filter(|(l, line)| l == level && line.contains(what))
            .count()
    };
    assert_eq!(at("WARN", "lease renewal failed;"), 2, "{text}");
    assert_eq!(at("DEBUG", "lease renewal failed again"), 2, "{text}");
    assert_eq!(
        at("INFO", "renewal succeeded again after 3 failures"),
        1,
        "{text}"
    );
    assert_eq!(
        at("INFO", "renewal succeeded again after 1 failures"),
        1,
        "{text}"
    );
    assert_eq!(at("INFO", "succeeded again"), 2, "{text}");
}

#[tokio::test(start_paused = true)]
async fn winning_a_campaign_and_the_leader_changes_an_observer_sees_are_logged_at_info() {
    let capture = install();
    let rec = Rec::new(Fake::new());
    let k = key("obs/elect");
    let election = Keeper::new(rec.clone())
        .with_backend_label("elected")
        .election(&k);
    let mut observer = election.observe();
    assert_eq!(observer.changed().await, None);
    let lead = election
        .campaign(Payload::new("v1").unwrap())
        .await
        .unwrap();
    assert!(observer.changed().await.is_some());
    lead.proclaim(Payload::new("v2").unwrap()).await.unwrap();
    assert!(observer.changed().await.is_some());
    lead.resign().await.unwrap();
    assert_eq!(observer.changed().await, None);

    let key_field = format!("key={}", k.as_str());
    let events: Vec<String> = capture
        .lines
        .lock()
        .unwrap()
        .iter()
        .filter(|l| l.starts_with("event ") && l.contains(&key_field))
        .cloned()
        .collect();
    let text = events.join("\n");
    let at = |level: &str, what: &str| {
        events
            .iter()
            .filter(|l| l.starts_with(&format!("event {level} ")) && l.contains(what))
            .count()
    };
    let holder = lead_holder(&text, election.keeper().holder().as_str());
    let spans = capture.lines.lock().unwrap().clone();
    assert!(
        spans.iter().any(|l| l.starts_with("span lease.acquire")
            && l.contains(&key_field)
            && l.contains("backend=elected")),
        "the campaign's acquire span does not name the backend"
    );
    assert_eq!(at("INFO", "became leader"), 1, "{text}");
    assert!(holder, "became leader does not name the holder:\n{text}");
    assert_eq!(at("INFO", "new leader"), 1, "{text}");
    assert_eq!(at("DEBUG", "value changed"), 1, "{text}");
    assert_eq!(at("INFO", "no leader"), 2, "{text}");
}

/// Whether the "became leader" line names a term of `holder`.
fn lead_holder(text: &str, holder: &str) -> bool {
    text.lines()
        .any(|l| l.contains("became leader") && l.contains(&format!("holder={holder}~")))
}
