//! `status`, `watch` and `break`.

use std::sync::Arc;
use std::time::Duration;

use lease::{
    BackendKind, BackendUrl, BreakNote, Connect, ConnectError, Error, Holding, LeaseBackend,
    LeaseKey, LeaseState,
};
use serde_json::{json, Value};
use tokio::time::Instant;

use crate::clients::Clients;
use crate::util::{self, human, now_unix_ms, rfc3339_ms};
use crate::{BreakArgs, Fail, KeyArgs, StatusArgs, WatchArgs, EXIT_NOT_HELD};

/// Parses URL and key (usage errors come before any connection), then connects.
pub async fn open(
    args: &KeyArgs,
    timeout: Duration,
    clients: &Clients,
) -> Result<(BackendKind, LeaseKey, Arc<dyn LeaseBackend>), Fail> {
    let (url, key) = args.url_and_key().map_err(Fail::usage)?;
    let target = BackendUrl::parse(&url).map_err(|e| Fail::usage(e.to_string()))?;
    let kind = target.kind();
    ensure_built(kind).map_err(Fail::usage)?;
    let key = LeaseKey::new(key).map_err(|e| Fail::usage(util::one_line(&e)))?;
    let connect = args
        .access
        .apply(&target, Connect::from(target.clone()).timeout(timeout))
        .map_err(Fail::usage)?;
    tracing::info!(backend = kind.name(), url = %target, key = %key, "connecting");
    let connection = connect.connect().await.map_err(|e| match e {
        ConnectError::Backend(e) => Fail::backend(&e),
        usage => Fail::usage(util::one_line(&usage)),
    })?;
    let backend = connection.backend();
    clients.note(connection);
    Ok((kind, key, backend))
}

/// Whether this build has the backend (each is a cargo feature); a usage
/// error otherwise. `memory://` is refused in every build: each `lease`
/// process would have a store of its own, which excludes nothing.
fn ensure_built(kind: BackendKind) -> Result<(), String> {
    if kind == BackendKind::Memory {
        return Err(
            "memory:// is the lease library's in-process store, for tests and examples: every `lease` process would get its own, so it would exclude nothing; use etcd://, nats://, mongodb://, postgres://, redis:// or s3://"
                .into(),
        );
    }
    if kind.is_enabled() {
        return Ok(());
    }
    Err(format!(
        "this build of `lease` has no {kind} support (install it with `cargo install lease-cli --features {}`)",
        kind.feature()
    ))
}

/// `fut` limited to `timeout`; running out is an unknown outcome.
pub async fn timed<T>(
    timeout: Duration,
    what: &str,
    fut: impl std::future::Future<Output = Result<T, Error>>,
) -> Result<T, Error> {
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => Err(Error::Unavailable {
            detail: format!(
                "{what} did not answer within {} (--request-timeout)",
                human(timeout)
            ),
            source: None,
        }),
    }
}

fn holding_json(h: &Holding) -> Value {
    json!({
        "holder": h.holder.as_str(),
        "fence": h.fence.get(),
        "remaining_ms": h.remaining.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
        "ttl_ms": u64::try_from(h.ttl.as_millis()).unwrap_or(u64::MAX),
        "payload_bytes": h.payload.len(),
    })
}

/// What the backend promises, for an operator reading `status`.
fn capabilities_json(c: &lease::Capabilities) -> Value {
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    json!({
        "time_authority": match c.time_authority {
            lease::TimeAuthority::BackendClock => "backend_clock",
            lease::TimeAuthority::LocalObservation => "local_observation",
            _ => "other",
        },
        "exclusion": match c.exclusion {
            lease::Exclusion::Atomic => "atomic",
            lease::Exclusion::ObservedExpiry => "observed_expiry",
            _ => "other",
        },
        "fence_scope": match c.fence_scope {
            lease::FenceScope::PerKey => "per_key",
            lease::FenceScope::Global => "global",
            _ => "other",
        },
        "watch": c.watch,
        "ttl_min_ms": ms(c.ttl.min),
        "ttl_granularity_ms": ms(c.ttl.granularity),
        "ttl_max_ms": ms(c.ttl.max),
        "max_payload_bytes": c.max_payload,
    })
}

/// The same, in words.
fn capabilities_line(c: &lease::Capabilities) -> String {
    let time = match c.time_authority {
        lease::TimeAuthority::BackendClock => "expiry judged on the backend's clock",
        lease::TimeAuthority::LocalObservation => {
            "expiry judged by observing a lease unchanged for a TTL on the taker's clock"
        }
        _ => "expiry judged by a rule this build of lease does not know",
    };
    let exclusion = match c.exclusion {
        lease::Exclusion::Atomic => "atomic exclusion",
        lease::Exclusion::ObservedExpiry => "exclusion while holders honour their deadlines",
        _ => "exclusion of a kind this build of lease does not know",
    };
    let fences = match c.fence_scope {
        lease::FenceScope::PerKey => "fences ordered per key",
        lease::FenceScope::Global => "fences ordered across all keys",
        _ => "fences ordered over a scope this build of lease does not know",
    };
    format!(
        "backend: {time}; {exclusion}; {fences}; {}; TTL {} to {} in steps of {}",
        if c.watch {
            "watches changes"
        } else {
            "polled (no watch)"
        },
        human(c.ttl.min),
        human(c.ttl.max),
        human(c.ttl.granularity)
    )
}

fn state_json(backend: &str, key: &LeaseKey, state: &LeaseState) -> Value {
    let mut v = json!({
        "backend": backend,
        "key": key.as_str(),
        "state": if state.is_free() { "free" } else { "held" },
    });
    if let (Some(h), Some(obj)) = (state.holding(), v.as_object_mut()) {
        if let Value::Object(fields) = holding_json(h) {
            obj.extend(fields);
        }
    }
    v
}

fn state_line(key: &LeaseKey, state: &LeaseState) -> String {
    match state {
        LeaseState::Free => format!("{key}: free"),
        LeaseState::Held(h) => {
            let remaining = match h.remaining {
                Some(r) => format!("{} remaining", human(r)),
                // Object stores: expiry is judged by observers over a TTL.
                None => "remaining time not reported by this backend".into(),
            };
            format!(
                "{key}: held by {} with fence {}, {remaining} of a {} TTL, payload {} bytes",
                h.holder,
                h.fence,
                human(h.ttl),
                h.payload.len()
            )
        }
    }
}

/// Reads `keys` at once, each bounded by `timeout`; their states, in order.
async fn read_all(
    backend: &Arc<dyn LeaseBackend>,
    keys: &[LeaseKey],
    timeout: Duration,
) -> Result<Vec<(LeaseKey, LeaseState)>, Error> {
    let mut reads = tokio::task::JoinSet::new();
    for (i, key) in keys.iter().enumerate() {
        let (backend, key) = (backend.clone(), key.clone());
        reads.spawn(async move {
            let state = timed(timeout, "read", backend.read(&key)).await;
            (i, key, state)
        });
    }
    let mut read = Vec::with_capacity(keys.len());
    while let Some(done) = reads.join_next().await {
        let (i, key, state) = done.map_err(|e| Error::Unavailable {
            detail: format!("a read ended without an answer: {e}"),
            source: None,
        })?;
        read.push((i, key, state?));
    }
    read.sort_by_key(|(i, _, _)| *i);
    Ok(read.into_iter().map(|(_, k, s)| (k, s)).collect())
}

/// What `status` shows of a key held shared: the registrations found held
/// and the exclusive intent (free or held).
struct SharedView {
    registrations: Vec<(LeaseKey, LeaseState)>,
    intent: (LeaseKey, LeaseState),
}

/// Reads the shared registrations and the exclusive intent of `key`, all
/// at once.
async fn read_shared(
    backend: &Arc<dyn LeaseBackend>,
    key: &LeaseKey,
    timeout: Duration,
) -> Result<SharedView, Error> {
    let mut keys = lease::shared::shared_slots(key)?;
    keys.push(lease::shared::exclusive_intent(key)?);
    let mut read = read_all(backend, &keys, timeout).await?;
    let intent = read.pop().ok_or_else(|| Error::Unavailable {
        detail: "the exclusive intent was not read".into(),
        source: None,
    })?;
    read.retain(|(_, s)| !s.is_free());
    Ok(SharedView {
        registrations: read,
        intent,
    })
}

/// `{key, ...holding}` for a held slot key.
fn slot_json(key: &LeaseKey, state: &LeaseState) -> Value {
    let mut v = json!({ "key": key.as_str() });
    if let (Some(h), Some(obj)) = (state.holding(), v.as_object_mut()) {
        if let Value::Object(fields) = holding_json(h) {
            obj.extend(fields);
        }
    }
    v
}

fn count(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

pub async fn status(args: StatusArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    let (target, key, backend) = open(&args.target, timeout, clients).await?;
    let permit_keys = match args.permits {
        Some(n) => lease::semaphore::permit_slots(&key, n).map_err(|e| Fail::backend(&e))?,
        None => Vec::new(),
    };
    let (state, permits) = tokio::join!(
        timed(timeout, "read", backend.read(&key)),
        read_all(&backend, &permit_keys, timeout)
    );
    let state = state.map_err(|e| Fail::backend(&e))?;
    let permits = permits.map_err(|e| Fail::backend(&e))?;
    let held_permits = permits.iter().filter(|(_, s)| !s.is_free()).count();
    let caps = backend.capabilities();
    let code = if state.is_free() && held_permits == 0 {
        EXIT_NOT_HELD
    } else {
        0
    };
    if args.quiet {
        return Ok(code);
    }
    let shared = match state.holding() {
        Some(h) if h.holder.as_str() == lease::SHARED_HOLDER => Some(
            read_shared(&backend, &key, timeout)
                .await
                .map_err(|e| Fail::backend(&e))?,
        ),
        _ => None,
    };
    if args.json {
        let mut v = state_json(target.name(), &key, &state);
        if let Some(obj) = v.as_object_mut() {
            if let Some(sh) = &shared {
                let (intent_key, intent) = &sh.intent;
                obj.insert(
                    "shared".into(),
                    json!({
                        "holders": sh.registrations.iter().map(|(k, s)| slot_json(k, s)).collect::<Vec<_>>(),
                        "exclusive_intent": intent.holding().map(|_| slot_json(intent_key, intent)),
                    }),
                );
            }
            if let Some(n) = args.permits {
                obj.insert(
                    "permits".into(),
                    json!({
                        "permits": n,
                        "held": count(held_permits),
                        "free": count(permits.len().saturating_sub(held_permits)),
                        "holders": permits
                            .iter()
                            .filter(|(_, s)| !s.is_free())
                            .map(|(k, s)| slot_json(k, s))
                            .collect::<Vec<_>>(),
                    }),
                );
            }
            obj.insert("capabilities".into(), capabilities_json(&caps));
        }
        util::out(&v.to_string());
    } else {
        util::out(&state_line(&key, &state));
        if let Some(sh) = &shared {
            util::out(&format!(
                "shared by {} holder{}:",
                sh.registrations.len(),
                if sh.registrations.len() == 1 { "" } else { "s" }
            ));
            for (k, s) in &sh.registrations {
                util::out(&format!("  {}", state_line(k, s)));
            }
            let (intent_key, intent) = &sh.intent;
            if !intent.is_free() {
                util::out(&format!(
                    "an exclusive holder waits (new shared holders are shut out):\n  {}",
                    state_line(intent_key, intent)
                ));
            }
        }
        if let Some(n) = args.permits {
            util::out(&format!(
                "permits: {held_permits} of {n} held, {} free",
                permits.len().saturating_sub(held_permits)
            ));
            for (k, s) in permits.iter().filter(|(_, s)| !s.is_free()) {
                util::out(&format!("  {}", state_line(k, s)));
            }
        }
        util::out(&capabilities_line(&caps));
    }
    Ok(code)
}

pub async fn watch(args: WatchArgs, timeout: Duration, clients: &Clients) -> Result<u8, Fail> {
    let (target, key, backend) = open(&args.target, timeout, clients).await?;
    let end = args.for_.map(|d| Instant::now() + d);
    let left = || end.map(|e| e.saturating_duration_since(Instant::now()));
    let mut last: Option<LeaseState> = None;
    let mut can_watch = backend.capabilities().watch;
    let mut failing = false;
    loop {
        if left() == Some(Duration::ZERO) {
            return Ok(0);
        }
        tracing::debug!(key = %key, "reading");
        let state = match timed(timeout, "read", backend.read(&key)).await {
            Ok(s) => {
                if failing {
                    eprintln!("lease: {key}: backend answers again");
                    failing = false;
                }
                s
            }
            Err(e) => {
                if let Error::CorruptRecord { .. } = e {
                    return Err(Fail::backend(&e));
                }
                // Keep watching through outages; say so once.
                if !failing {
                    eprintln!("lease: {key}: {} (retrying)", util::one_line(&e));
                    failing = true;
                }
                sleep_capped(args.interval, left()).await;
                continue;
            }
        };
        if last.as_ref().is_none_or(|l| !l.same_grant(&state)) {
            let at = now_unix_ms();
            if args.json {
                let mut v = state_json(target.name(), &key, &state);
                if let Some(obj) = v.as_object_mut() {
                    obj.insert("at".into(), json!(rfc3339_ms(at)));
                }
                util::out(&v.to_string());
            } else {
                util::out(&format!("{} {}", rfc3339_ms(at), state_line(&key, &state)));
            }
            last = Some(state.clone());
        }
        tracing::debug!(state = ?state, can_watch, "read");
        if can_watch {
            // Re-read at least every minute even when the watch stays quiet.
            let cap = left()
                .unwrap_or(Duration::from_secs(60))
                .min(Duration::from_secs(60));
            match tokio::time::timeout(cap, backend.wait_for_change(&key, &state)).await {
                Ok(Ok(())) | Err(_) => {}
                Ok(Err(Error::Unsupported { .. })) => can_watch = false,
                Ok(Err(e)) => {
                    tracing::debug!(error = %lease::ErrorChain::new(&e), "watch failed; re-reading");
                    sleep_capped(args.interval, left()).await;
                }
            }
        } else {
            sleep_capped(args.interval, left()).await;
        }
    }
}

async fn sleep_capped(d: Duration, left: Option<Duration>) {
    tokio::time::sleep(left.map_or(d, |l| l.min(d))).await;
}

/// Why `--if-fence` / `--if-holder` refuse `live` (`None` when it is the
/// grant they name).
fn guard_refusal(args: &BreakArgs, key: &LeaseKey, live: Option<&Holding>) -> Option<String> {
    let named = match (args.if_fence, &args.if_holder) {
        (Some(f), Some(h)) => format!("fence {f} of {h}"),
        (Some(f), None) => format!("fence {f}"),
        (None, Some(h)) => format!("a grant of {h}"),
        (None, None) => return None,
    };
    let Some(h) = live else {
        return Some(format!(
            "{key} is free, not held by {named}; nothing was broken"
        ));
    };
    let fence_ok = args.if_fence.is_none_or(|f| f == h.fence.get());
    let holder_ok = args
        .if_holder
        .as_deref()
        .is_none_or(|want| want == h.holder.as_str());
    (!(fence_ok && holder_ok)).then(|| {
        format!(
            "{key} is held by {} with fence {}, not {named}; nothing was broken",
            h.holder, h.fence
        )
    })
}

pub async fn break_lease(
    args: BreakArgs,
    timeout: Duration,
    clients: &Clients,
) -> Result<u8, Fail> {
    if args.reason.trim().is_empty() {
        return Err(Fail::usage("--reason must not be empty"));
    }
    let (target, key, backend) = open(&args.target, timeout, clients).await?;
    let guarded = args.if_fence.is_some() || args.if_holder.is_some();
    if guarded {
        let state = timed(timeout, "read", backend.read(&key))
            .await
            .map_err(|e| Fail::backend(&e))?;
        if let Some(refusal) = guard_refusal(&args, &key, state.holding()) {
            return Err(Fail {
                code: EXIT_NOT_HELD,
                message: refusal,
            });
        }
    }
    let note = BreakNote::new(
        args.by
            .clone()
            .unwrap_or_else(|| format!("{}@{}", util::user(), util::hostname())),
        args.reason.clone(),
    )
    .with_at_unix_ms(now_unix_ms());
    let broken = timed(timeout, "break", backend.break_lease(&key, &note))
        .await
        .map_err(|e| Fail::backend(&e))?;
    if guarded {
        // The grant changed between the read and the break.
        if let Some(refusal) = guard_refusal(&args, &key, broken.previous.as_ref()) {
            eprintln!("lease: the lease changed between the check and the break: {refusal}");
        }
    }
    if args.json {
        util::out(
            &json!({
                "backend": target.name(),
                "key": key.as_str(),
                "by": note.by,
                "reason": note.reason,
                "at": rfc3339_ms(note.at_unix_ms),
                "previous": broken.previous.as_ref().map(holding_json),
                "audit": broken.audit,
            })
            .to_string(),
        );
    } else {
        match &broken.previous {
            Some(h) => util::out(&format!(
                "{key}: broke the lease of {} (fence {}); audit record: {}",
                h.holder, h.fence, broken.audit
            )),
            None => util::out(&format!(
                "{key}: no live lease was held; audit record: {}",
                broken.audit
            )),
        }
    }
    Ok(0)
}
