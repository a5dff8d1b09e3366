//! The history checker: the four checks of the module docs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;
use std::time::{Duration, Instant};

use lease_core::Fence;
use lease_keeper::SHARED_HOLDER;

use super::{Op, OpKind, OpOutcome};

/// What the checker may assume about the run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CheckOptions {
    /// Hold grants to exclusion (check 1). Turn it off only for faults that
    /// legitimately break the holder-side deadline — the backend's clock
    /// jumping forward by more than the slack between deadline and expiry —
    /// where overlaps are counted (as `tolerated_overlaps`) instead of failed,
    /// and only the fenced resource (check 4) stands between them and harm.
    pub exclusive_windows: bool,
    /// At most this many violations of each kind are reported per key.
    pub max_per_kind: usize,
    /// How long after its write window a leader's work may still be
    /// dropped, and how far it may reach into another holder's window
    /// (check 5): the timer that ends it must be woken and scheduled on a
    /// busy machine. A share of the TTL ([`CheckOptions::for_ttl`]), so that
    /// work running well past its window is flagged at every TTL.
    pub work_slack: Duration,
}

/// The share of the TTL that [`CheckOptions::work_slack`] is by default.
pub const WORK_SLACK_SHARE: f64 = 1.0 / 6.0;

impl CheckOptions {
    /// The defaults for a run whose grants have `ttl`: a work slack of
    /// [`WORK_SLACK_SHARE`] of it.
    pub fn for_ttl(ttl: Duration) -> CheckOptions {
        CheckOptions {
            work_slack: ttl.mul_f64(WORK_SLACK_SHARE),
            ..CheckOptions::default()
        }
    }
}

impl Default for CheckOptions {
    /// Exclusive windows, 3 violations per kind and key, and the work slack
    /// of a 1.5 s TTL (250 ms).
    fn default() -> Self {
        CheckOptions {
            exclusive_windows: true,
            max_per_kind: 3,
            work_slack: Duration::from_millis(250),
        }
    }
}

/// Which rule a violation breaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[non_exhaustive]
pub enum ViolationKind {
    /// (1) Two holders' write windows on a key overlap, or the backend showed
    /// another holder while one's window was open.
    Overlap,
    /// (1) The backend showed a key free while a holder's window was open
    /// (and it had not released).
    EarlyExpiry,
    /// (2) An operation invoked after another completed saw a lower fence.
    FenceRegression,
    /// (2) One fence was seen with two different holders.
    FenceReused,
    /// (3) One holder had two different live grants on a key at once (the
    /// retry of an unknown acquire got a second grant beside the first).
    DoubleGrant,
    /// (3) A grant was observed that no holder was told of and no acquire
    /// with unknown outcome can explain.
    UnexplainedGrant,
    /// (3) An acquire was refused naming the caller itself: its own live
    /// grant (from an answer that was lost) was not handed back.
    RefusedBySelf,
    /// (4) The resource accepted a write with a fence lower than one it had
    /// already accepted.
    StaleWriteAccepted,
    /// A grant's `sent_at` lies after the answer that returned it: its
    /// deadline would count from an instant later than any send. (Before the
    /// call is allowed: a grant may rest on an earlier request, which only
    /// shortens its holder's write time.)
    SentAtAfterAnswer,
    /// (5) Two leaders' work on a key ran at the same time, or a leader's
    /// work ran into another holder's write window.
    WorkOverlap,
    /// (5) A leader's work ran past its grant's write window, or with none.
    WorkPastDeadline,
}

impl fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ViolationKind::Overlap => "overlapping write windows",
            ViolationKind::EarlyExpiry => "key free inside a write window",
            ViolationKind::FenceRegression => "fence went backwards",
            ViolationKind::FenceReused => "one fence, two holders",
            ViolationKind::DoubleGrant => "two live grants for one holder",
            ViolationKind::UnexplainedGrant => "grant nobody asked for",
            ViolationKind::RefusedBySelf => "refused by its own grant",
            ViolationKind::StaleWriteAccepted => "stale write accepted",
            ViolationKind::SentAtAfterAnswer => "sent_at after the answer",
            ViolationKind::WorkOverlap => "two leaders' work at once",
            ViolationKind::WorkPastDeadline => "work past its write window",
        })
    }
}

/// One broken rule, with the operations that show it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Violation {
    /// The rule.
    pub kind: ViolationKind,
    /// The key.
    pub key: String,
    /// What happened, with times in ms since the history's first operation.
    pub detail: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "[{}] key {:?}: {}", self.kind, self.key, self.detail)
    }
}

/// What the checker found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Broken rules (empty: the history is safe).
    pub violations: Vec<Violation>,
    /// Operations checked.
    pub ops: usize,
    /// Distinct grants (holder, fence) holders were told of.
    pub grants: usize,
    /// Operations with unknown outcome that the backend made so (an error
    /// or no answer in time); calls their caller dropped are in `dropped`.
    pub unknown: usize,
    /// Calls their caller dropped before the answer (a keeper's deadline or
    /// resign): judged as unknown outcomes like the others, but counted
    /// apart, because no fault of the backend caused them.
    pub dropped: usize,
    /// Acquires with unknown outcome that their holder retried (check 3's
    /// case), and how many of those retries were granted.
    pub retried_unknown_acquires: usize,
    /// Of those retries, how many were granted (the rest were refused or failed).
    pub retries_granted: usize,
    /// Window overlaps seen while `exclusive_windows` was off.
    pub tolerated_overlaps: usize,
    /// Writes the resource accepted.
    pub writes_accepted: usize,
    /// Writes the resource rejected as stale.
    pub writes_rejected: usize,
    /// Leaders' work intervals checked (check 5).
    pub work_runs: usize,
    /// Acquires that were answered with a grant their holder had released
    /// before with unknown outcome. That release may still land at any
    /// time and free the key under the holder, so no write window opens:
    /// the contract guarantees none. A harness whose holders do this writes
    /// unchecked; the fault runs' holders take a new holder id per term
    /// (as a keeper does) and make none.
    pub reacquired_after_unknown_release: usize,
}

impl CheckReport {
    /// Whether no rule was broken.
    pub fn is_safe(&self) -> bool {
        self.violations.is_empty()
    }

    /// Whether some violation of `kind` was found.
    pub fn found(&self, kind: ViolationKind) -> bool {
        self.violations.iter().any(|v| v.kind == kind)
    }

    /// The violations, one per line.
    pub fn summary(&self) -> String {
        self.violations
            .iter()
            .map(|v| v.to_string())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// A stretch of time during which a holder was entitled to write with a
/// grant: from the answer that told it of the grant to the grant's deadline
/// (extended by later renewals), cut at the holder's release.
#[derive(Clone, Debug)]
struct Window {
    holder: String,
    fence: Fence,
    start: Instant,
    end: Instant,
    /// The operation that opened it.
    opened_by: u64,
    /// Spans inside it between a deadline and the late answer that
    /// extended it: the holder could not write there, and the key seen
    /// free there is no early expiry. Every other check spans them: a
    /// grant another holder was told of there, before this grant was
    /// renewed again, still overlaps it.
    gaps: Vec<(Instant, Instant)>,
    /// Whether a release (or a renewal answered lost) ended it before its
    /// deadline. A release under the holder id of a shared phase may come
    /// from another process (the exclusive holder that ends an empty
    /// phase), so work a shared holder still runs past it is a takeover,
    /// like a plain grant's holder running into another's window.
    cut: bool,
}

struct Ctx<'a> {
    origin: Instant,
    opts: &'a CheckOptions,
    counts: HashMap<(String, ViolationKind), usize>,
    report: CheckReport,
}

impl Ctx<'_> {
    fn ms(&self, t: Instant) -> String {
        ms_since(self.origin, t)
    }

    fn flag(&mut self, kind: ViolationKind, key: &str, detail: String) {
        let n = self.counts.entry((key.to_string(), kind)).or_insert(0);
        *n += 1;
        if *n <= self.opts.max_per_kind {
            self.report.violations.push(Violation {
                kind,
                key: key.to_string(),
                detail,
            });
        }
    }

    fn win(&self, w: &Window) -> String {
        format!(
            "{} fence {} [{}, {}] (opened by #{})",
            w.holder,
            w.fence,
            self.ms(w.start),
            self.ms(w.end),
            w.opened_by
        )
    }

    fn op(&self, o: &Op) -> String {
        format!("{o} [{}, {}]", self.ms(o.invoked), self.ms(o.completed))
    }
}

/// The instant a history's times are stated from: its first operation's.
fn origin(ops: &[Op]) -> Instant {
    ops.iter()
        .map(|o| o.invoked)
        .min()
        .unwrap_or_else(Instant::now)
}

/// `t` as a violation states it: milliseconds since `origin`.
fn ms_since(origin: Instant, t: Instant) -> String {
    let d = t.saturating_duration_since(origin);
    format!("{:.1}ms", d.as_secs_f64() * 1000.0)
}

/// Every operation of `ops` on a key `report` flagged, and on the keys
/// under it (a shared lock's slots and intent), one line each under a line
/// naming the key, with its send instant and deadline where it has them:
/// what a violation seen once on a loaded machine needs to be read. Times
/// are stated as the violations state them.
pub fn flagged_ops(ops: &[Op], report: &CheckReport) -> Vec<String> {
    let origin = origin(ops);
    let ms = |t: Instant| ms_since(origin, t);
    let mut keys: Vec<&str> = report.violations.iter().map(|v| v.key.as_str()).collect();
    keys.sort_unstable();
    keys.dedup();
    let mut lines = Vec::new();
    for key in keys {
        let under = format!("{key}/");
        lines.push(format!("operations on {key:?} and the keys under it:"));
        for o in ops
            .iter()
            .filter(|o| o.key == key || o.key.starts_with(&under))
        {
            let mut line = format!("  {o} [{}, {}]", ms(o.invoked), ms(o.completed));
            if let Some(sent) = o.sent_at {
                line.push_str(&format!(" sent at {}", ms(sent)));
            }
            if let Some(deadline) = o.deadline {
                line.push_str(&format!(" deadline {}", ms(deadline)));
            }
            lines.push(line);
        }
    }
    lines
}

/// Checks a whole history; see the module docs for the rules.
pub fn check(ops: &[Op], opts: &CheckOptions) -> CheckReport {
    let origin = origin(ops);
    let mut cx = Ctx {
        origin,
        opts,
        counts: HashMap::new(),
        report: CheckReport {
            ops: ops.len(),
            unknown: ops
                .iter()
                .filter(|o| o.outcome == OpOutcome::Unknown && !o.dropped)
                .count(),
            dropped: ops
                .iter()
                .filter(|o| o.outcome == OpOutcome::Unknown && o.dropped)
                .count(),
            ..CheckReport::default()
        },
    };
    let mut by_key: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops {
        by_key.entry(op.key.as_str()).or_default().push(op);
    }
    for (key, ops) in by_key {
        check_key(&mut cx, key, &ops);
    }
    let mut report = cx.report;
    report.violations.sort_by_key(|v| v.kind);
    report
}

fn check_key(cx: &mut Ctx<'_>, key: &str, ops: &[&Op]) {
    sent_at_before_answers(cx, key, ops);
    let windows = windows(ops, &mut cx.report.reacquired_after_unknown_release);
    // Every grant a holder was told of, whether or not its answer came in
    // time to open a window.
    let told: BTreeSet<(String, Fence)> = ops
        .iter()
        .filter(|o| matches!(o.kind, OpKind::Acquire | OpKind::Renew) && o.outcome == OpOutcome::Ok)
        .filter_map(|o| o.fence.map(|f| (o.holder.clone(), f)))
        .collect();
    cx.report.grants += told.len();
    overlaps(cx, key, &windows);
    observations_inside_windows(cx, key, ops, &windows);
    fence_order(cx, key, ops);
    unknown_outcomes(cx, key, ops, &told);
    resource(cx, key, ops);
    work(cx, key, ops, &windows);
}

fn sent_at_before_answers(cx: &mut Ctx<'_>, key: &str, ops: &[&Op]) {
    for o in ops {
        if let (Some(sent), OpOutcome::Ok) = (o.sent_at, o.outcome) {
            if sent > o.completed {
                let d = format!("{} has sent_at {}", cx.op(o), cx.ms(sent));
                cx.flag(ViolationKind::SentAtAfterAnswer, key, d);
            }
        }
    }
}

/// The write windows of every grant a holder was told of; counts in
/// `withheld` the acquires that open none because an earlier release of
/// their grant had an unknown outcome.
fn windows(ops: &[&Op], withheld: &mut usize) -> Vec<Window> {
    // Per (holder, fence): grant answers (completed, deadline, seq) and
    // release invocations, walked in time order.
    enum Ev {
        Grant {
            deadline: Instant,
            seq: u64,
            renewal: bool,
        },
        /// A release (`unknown`: with unknown outcome), or a renewal
        /// answered lost.
        Release { unknown: bool },
    }
    let mut events: BTreeMap<(String, Fence), Vec<(Instant, Ev)>> = BTreeMap::new();
    for o in ops {
        match (o.kind, o.outcome, o.fence, o.deadline) {
            (OpKind::Acquire | OpKind::Renew, OpOutcome::Ok, Some(f), Some(d)) => {
                events.entry((o.holder.clone(), f)).or_default().push((
                    o.completed,
                    Ev::Grant {
                        deadline: d,
                        seq: o.seq,
                        renewal: o.kind == OpKind::Renew,
                    },
                ));
            }
            (OpKind::Release, outcome, Some(f), _) => {
                events.entry((o.holder.clone(), f)).or_default().push((
                    o.invoked,
                    Ev::Release {
                        unknown: outcome == OpOutcome::Unknown,
                    },
                ));
            }
            // Told its grant is lost, the holder stops writing. (Lost before
            // the deadline is itself suspect, but only harmful if another
            // grant overlapped — which the other checks catch.)
            (OpKind::Renew, OpOutcome::Lost, Some(f), _) => {
                events
                    .entry((o.holder.clone(), f))
                    .or_default()
                    .push((o.completed, Ev::Release { unknown: false }));
            }
            _ => {}
        }
    }
    let mut out = Vec::new();
    for ((holder, fence), mut evs) in events {
        evs.sort_by_key(|(t, _)| *t);
        let mut open: Option<Window> = None;
        // Whether the holder has begun giving this grant up: a renewal
        // answered after that (one in flight when a keeper resigned) does
        // not reopen the window, since the holder no longer writes with it.
        let mut given_up = false;
        // Whether a release of this grant had an unknown outcome: it may
        // land at any later instant and free the key, so the grant opens
        // no window again, even if an acquire hands it back (the release
        // had not landed yet).
        let mut may_land = false;
        for (t, ev) in evs {
            match ev {
                Ev::Grant { renewal: true, .. } if given_up => {}
                Ev::Grant { renewal: false, .. } if may_land => {
                    *withheld += 1;
                }
                Ev::Grant { deadline, seq, .. } => match &mut open {
                    Some(w) => {
                        // Answered after the window had closed: between its
                        // end and this answer the holder could not write, and
                        // the key may have been free (a renewal that reached
                        // the server late finds the grant expired, and revives
                        // it if nobody took it meanwhile).
                        if t > w.end {
                            w.gaps.push((w.end, t));
                        }
                        w.end = w.end.max(deadline);
                    }
                    None if deadline <= t => {}
                    None => {
                        // Only an acquire gets here after a release whose
                        // outcome is known: one that failed, changing
                        // nothing, and the grant came back.
                        given_up = false;
                        open = Some(Window {
                            holder: holder.clone(),
                            fence,
                            start: t,
                            end: deadline,
                            opened_by: seq,
                            cut: false,
                            gaps: Vec::new(),
                        })
                    }
                },
                Ev::Release { unknown } => {
                    given_up = true;
                    may_land |= unknown;
                    if let Some(mut w) = open.take() {
                        w.cut = t < w.end;
                        w.end = w.end.min(t).max(w.start);
                        out.push(w);
                    }
                }
            }
        }
        out.extend(open);
    }
    out.retain(|w| w.end > w.start);
    out.sort_by_key(|w| w.start);
    out
}

/// (1) No two windows of different grants overlap.
fn overlaps(cx: &mut Ctx<'_>, key: &str, windows: &[Window]) {
    for (i, a) in windows.iter().enumerate() {
        for b in &windows[i + 1..] {
            if b.start >= a.end {
                // Sorted by start: later windows start even later, but an
                // earlier long window may still reach them; keep scanning
                // only while b could overlap a.
                break;
            }
            if a.holder == b.holder && a.fence == b.fence {
                continue;
            }
            // A backend clock jumping forward expires grants under any
            // holder's feet; the next grant is another holder's, or the
            // next shared phase's (all phases share one holder name).
            if jumps_allow(cx, &a.holder, &b.holder) {
                cx.report.tolerated_overlaps += 1;
                continue;
            }
            let detail = format!("{} overlaps {}", cx.win(a), cx.win(b));
            if a.holder == b.holder {
                cx.flag(ViolationKind::DoubleGrant, key, detail);
            } else {
                cx.flag(ViolationKind::Overlap, key, detail);
            }
        }
    }
}

/// Whether a second grant beside one of `a`'s may be counted rather than
/// failed: only where the backend's clock jumps forward past the deadline
/// slack, and never for one holder's two grants, since every holder but
/// the shared phases' takes a new name per term. A jump cannot give one
/// term two grants, but it can end one shared phase under its readers and
/// let the next begin under the same name.
fn jumps_allow(cx: &Ctx<'_>, a: &str, b: &str) -> bool {
    !cx.opts.exclusive_windows && (a != b || a == SHARED_HOLDER)
}

/// (1) A refusal or read made entirely inside a window sees that window's
/// grant, not another one and not a free key.
fn observations_inside_windows(cx: &mut Ctx<'_>, key: &str, ops: &[&Op], windows: &[Window]) {
    // `windows` is sorted by start; the running maximum of their ends lets
    // each observation visit only the windows that can contain it.
    let mut max_end: Vec<Instant> = Vec::with_capacity(windows.len());
    for w in windows {
        let m = max_end.last().map_or(w.end, |m: &Instant| (*m).max(w.end));
        max_end.push(m);
    }
    for o in ops {
        let is_observation = matches!(
            (o.kind, o.outcome),
            (OpKind::Acquire, OpOutcome::Refused) | (OpKind::Read, OpOutcome::Ok)
        );
        if !is_observation {
            continue;
        }
        let n = windows.partition_point(|w| w.start <= o.invoked);
        for i in (0..n).rev() {
            if max_end[i] < o.completed {
                break;
            }
            let w = &windows[i];
            if o.completed > w.end {
                continue;
            }
            match &o.observed {
                Some((h, f)) if *h == w.holder && *f == w.fence => {}
                Some((h, _)) => {
                    if jumps_allow(cx, h, &w.holder) {
                        cx.report.tolerated_overlaps += 1;
                        continue;
                    }
                    let detail = format!("{} made inside {}", cx.op(o), cx.win(w));
                    if *h == w.holder {
                        cx.flag(ViolationKind::DoubleGrant, key, detail);
                    } else {
                        cx.flag(ViolationKind::Overlap, key, detail);
                    }
                }
                None => {
                    let in_gap = w
                        .gaps
                        .iter()
                        .any(|(from, to)| o.invoked < *to && o.completed > *from);
                    if cx.opts.exclusive_windows && !in_gap {
                        let detail = format!("{} saw the key free inside {}", cx.op(o), cx.win(w));
                        cx.flag(ViolationKind::EarlyExpiry, key, detail);
                    }
                }
            }
        }
    }
}

/// Whether `holder` is a backend's placeholder for "held, by a grant not
/// known" — a name in angle brackets, such as lease-s3's
/// `<record-missing>` for a key whose record is missing but that is not yet
/// provably free — rather than a holder's own id. A placeholder is no
/// grant: nobody is told of it or writes under it, and the fence it shows
/// is the highest known for the key, which a real grant also has. It is
/// held to the fence order, never to the rules of grants (a fence naming
/// one holder, a grant nobody asked for).
///
/// Only what an operation *observed* can be a placeholder (a refusal or a
/// read naming it): a holder's own granted acquire or renewal is a grant,
/// whatever its id looks like.
fn is_placeholder(op: &Op, holder: &str) -> bool {
    let observed = matches!(
        (op.kind, op.outcome),
        (OpKind::Read, OpOutcome::Ok) | (OpKind::Acquire, OpOutcome::Refused)
    );
    observed
        && holder != op.holder
        && holder.len() > 2
        && holder.starts_with('<')
        && holder.ends_with('>')
}

/// (2) Fences never go backwards in real-time order, and name one holder.
fn fence_order(cx: &mut Ctx<'_>, key: &str, ops: &[&Op]) {
    let mut seen: Vec<(&Op, &str, Fence)> = ops
        .iter()
        .filter_map(|o| o.fence_seen().map(|(h, f)| (*o, h, f)))
        .collect();

    let mut holder_of: HashMap<Fence, (&str, &Op)> = HashMap::new();
    for (o, h, f) in seen.iter().filter(|(o, h, _)| !is_placeholder(o, h)) {
        match holder_of.get(f) {
            Some((h0, o0)) if h0 != h => {
                let d = format!(
                    "fence {f} seen with {h0} in {} and with {h} in {}",
                    cx.op(o0),
                    cx.op(o)
                );
                cx.flag(ViolationKind::FenceReused, key, d);
            }
            Some(_) => {}
            None => {
                holder_of.insert(*f, (h, o));
            }
        }
    }

    // Sweep: by completion, with the running maximum fence.
    seen.sort_by_key(|(o, _, _)| o.completed);
    let mut prefix: Vec<(Instant, Fence, &Op)> = Vec::with_capacity(seen.len());
    for (o, _, f) in &seen {
        let best = match prefix.last() {
            Some((_, bf, bo)) if *bf >= *f => (o.completed, *bf, *bo),
            _ => (o.completed, *f, *o),
        };
        prefix.push(best);
    }
    for (o, _, f) in &seen {
        // Operations completed strictly before `o` was invoked.
        let n = prefix.partition_point(|(c, _, _)| *c < o.invoked);
        if n == 0 {
            continue;
        }
        let (_, max, by) = prefix[n - 1];
        if max > *f {
            let d = format!(
                "{} saw fence {f} after {} had seen fence {max}",
                cx.op(o),
                cx.op(by)
            );
            cx.flag(ViolationKind::FenceRegression, key, d);
        }
    }
}

/// (3) Unknown outcomes count as applied and not applied: a grant nobody
/// was told of needs an unknown acquire of its holder to explain it; that
/// ghost must not stay live beside a later grant of the same holder; and no
/// acquire is refused in the name of the caller itself.
fn unknown_outcomes(cx: &mut Ctx<'_>, key: &str, ops: &[&Op], told: &BTreeSet<(String, Fence)>) {
    // Per holder: its acquires with unknown outcome, and its granted ones.
    let mut unknown: HashMap<&str, Vec<&Op>> = HashMap::new();
    let mut granted: HashMap<&str, Vec<&Op>> = HashMap::new();
    for o in ops {
        match (o.kind, o.outcome) {
            (OpKind::Acquire, OpOutcome::Unknown) => unknown.entry(&o.holder).or_default().push(o),
            (OpKind::Acquire, OpOutcome::Ok) => granted.entry(&o.holder).or_default().push(o),
            _ => {}
        }
    }
    // Check 3's case: an unknown acquire and its holder's next acquire.
    for us in unknown.values() {
        for u in us {
            let retry = ops.iter().find(|r| {
                r.kind == OpKind::Acquire && r.holder == u.holder && r.invoked >= u.completed
            });
            if let Some(r) = retry {
                cx.report.retried_unknown_acquires += 1;
                if r.outcome == OpOutcome::Ok {
                    cx.report.retries_granted += 1;
                }
            }
        }
    }
    for o in ops {
        if o.kind == OpKind::Acquire && o.outcome == OpOutcome::Refused {
            if let Some((h, f)) = &o.observed {
                if *h == o.holder {
                    let d = format!(
                        "{}: the backend refused {h} in the name of its own grant {f}",
                        cx.op(o)
                    );
                    cx.flag(ViolationKind::RefusedBySelf, key, d);
                }
            }
        }
        let Some((h, f)) = o.fence_seen() else {
            continue;
        };
        if told.contains(&(h.to_string(), f)) || is_placeholder(o, h) {
            continue;
        }
        // A ghost: explained only by an earlier acquire of `h` with unknown
        // outcome (the latest such: the one most likely to have applied it).
        let cause = unknown
            .get(h)
            .and_then(|us| us.iter().rev().find(|u| u.invoked < o.completed));
        let Some(cause) = cause else {
            let d = format!(
                "{} saw {h} holding fence {f}, but {h} was never told of that grant and made no acquire with unknown outcome before",
                cx.op(o)
            );
            cx.flag(ViolationKind::UnexplainedGrant, key, d);
            continue;
        };
        // The ghost is live at `o`. A later grant of another fence told to
        // the same holder, completed before `o` started, means two live grants.
        let second = granted.get(h).and_then(|rs| {
            rs.iter().find(|r| {
                r.fence != Some(f) && r.invoked > cause.invoked && r.completed < o.invoked
            })
        });
        if let Some(r) = second {
            if jumps_allow(cx, h, h) {
                cx.report.tolerated_overlaps += 1;
                continue;
            }
            let d = format!(
                "after {} (outcome unknown), the retry {} got another grant, yet {} still saw the first one ({h}, fence {f}) live",
                cx.op(cause),
                cx.op(r),
                cx.op(o)
            );
            cx.flag(ViolationKind::DoubleGrant, key, d);
        }
    }
}

/// (4) Replays the resource's log: no accepted write below the highest
/// fence accepted before it.
fn resource(cx: &mut Ctx<'_>, key: &str, ops: &[&Op]) {
    let mut writes: Vec<&&Op> = ops.iter().filter(|o| o.kind == OpKind::Write).collect();
    writes.sort_by_key(|o| o.seq);
    let mut highest: Option<(Fence, &Op)> = None;
    for w in writes {
        let Some(f) = w.fence else { continue };
        match w.outcome {
            OpOutcome::Ok => {
                cx.report.writes_accepted += 1;
                match highest {
                    Some((h, by)) if f < h => {
                        let d = format!(
                            "{} accepted after {} had written with fence {h}",
                            cx.op(w),
                            cx.op(by)
                        );
                        cx.flag(ViolationKind::StaleWriteAccepted, key, d);
                    }
                    Some((h, _)) if f == h => {}
                    _ => highest = Some((f, w)),
                }
            }
            _ => cx.report.writes_rejected += 1,
        }
    }
}

/// (5) Leaders' work: never two at once on a key, never past the write
/// window of the grant it ran under (plus the slack), never without one, and
/// never into another holder's write window (plus the slack): a grant told
/// to another holder means the work's own grant was over on the backend.
fn work(cx: &mut Ctx<'_>, key: &str, ops: &[&Op], windows: &[Window]) {
    let mut runs: Vec<&Op> = ops
        .iter()
        .copied()
        .filter(|o| o.kind == OpKind::Work)
        .collect();
    runs.sort_by_key(|o| o.invoked);
    cx.report.work_runs += runs.len();
    let slack = cx.opts.work_slack;
    for w in &runs {
        let Some(fence) = w.fence else { continue };
        let own = |x: &&Window| x.holder == w.holder && x.fence == fence;
        let window = windows
            .iter()
            .filter(|x| own(x) && x.start <= w.invoked)
            .max_by_key(|x| x.end);
        // The slack covers dropping work at the end of its window, never
        // starting it after.
        let past = match window {
            None => Some("ran with no write window of its grant".to_string()),
            // A shared phase's window cut by another process (the exclusive
            // holder ending a phase a large forward jump made look empty)
            // just after a member joined: the member starts work not knowing
            // of the cut, within the slack. Where jumps break holder-side
            // deadlines this is a takeover, counted as overlaps are. Only a
            // shared phase's: any other holder's window is cut by its own
            // release or a renewal it was told was lost, after which its
            // work must not start.
            Some(x)
                if w.invoked >= x.end
                    && x.cut
                    && w.invoked <= x.end + slack
                    && x.holder == SHARED_HOLDER
                    && !cx.opts.exclusive_windows =>
            {
                cx.report.tolerated_overlaps += 1;
                None
            }
            Some(x) if w.invoked >= x.end => Some(format!(
                "started {:?} after the end of {}",
                w.invoked.saturating_duration_since(x.end),
                cx.win(x)
            )),
            // Where the fault legitimately breaks holder-side deadlines (a
            // large forward clock jump), a window cut short by another
            // process ending it is a takeover: counted, as overlaps are.
            Some(x) if w.completed > x.end + slack && x.cut && !cx.opts.exclusive_windows => {
                cx.report.tolerated_overlaps += 1;
                None
            }
            Some(x) if w.completed > x.end + slack => Some(format!(
                "ended {:?} after the end of {} (slack {slack:?})",
                w.completed.saturating_duration_since(x.end),
                cx.win(x)
            )),
            Some(_) => None,
        };
        if let Some(what) = past {
            let d = format!("{} {what}", cx.op(w));
            cx.flag(ViolationKind::WorkPastDeadline, key, d);
        }
        // Another holder's window: the work may not start inside it, nor
        // reach into it by more than the slack.
        let reach = w.completed.checked_sub(slack).unwrap_or(w.invoked);
        let other = windows
            .iter()
            .find(|x| !own(x) && x.end > w.invoked && (x.start <= w.invoked || x.start < reach));
        if let Some(x) = other {
            if !cx.opts.exclusive_windows {
                cx.report.tolerated_overlaps += 1;
                continue;
            }
            let d = format!(
                "{} ran {:?} into {}",
                cx.op(w),
                w.completed
                    .saturating_duration_since(x.start.max(w.invoked)),
                cx.win(x)
            );
            cx.flag(ViolationKind::WorkOverlap, key, d);
        }
    }
    for (i, a) in runs.iter().enumerate() {
        for b in &runs[i + 1..] {
            if b.invoked >= a.completed {
                break;
            }
            if a.holder == b.holder && a.fence == b.fence {
                continue;
            }
            if !cx.opts.exclusive_windows {
                cx.report.tolerated_overlaps += 1;
                continue;
            }
            let d = format!("{} overlaps {}", cx.op(a), cx.op(b));
            cx.flag(ViolationKind::WorkOverlap, key, d);
        }
    }
}
