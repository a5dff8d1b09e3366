//! The state-machine property: random interleavings against a reference model.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use lease_core::{
    Acquire, Fence, Grant, HolderId, LeaseBackend, LeaseKey, LeaseState, Payload, Renewal,
};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, TestRunner};

use super::{clients, key, long_ttl, PropFuture};
use crate::{Failure, Harness, Outcome};

const CLIENTS: usize = 3;
const KEYS: usize = 2;

/// One step of a case. Client `c` acts with its own holder id.
#[derive(Clone, Copy, Debug)]
enum Op {
    Acquire {
        c: usize,
        k: usize,
    },
    /// Renews `c`'s most recent grant on `k` (a no-op if it never had one).
    Renew {
        c: usize,
        k: usize,
        new_payload: bool,
    },
    Release {
        c: usize,
        k: usize,
    },
    Read {
        c: usize,
        k: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let c = 0..CLIENTS;
    let k = 0..KEYS;
    prop_oneof![
        3 => (c.clone(), k.clone()).prop_map(|(c, k)| Op::Acquire { c, k }),
        2 => (c.clone(), k.clone(), any::<bool>()).prop_map(|(c, k, new_payload)| Op::Renew { c, k, new_payload }),
        2 => (c.clone(), k.clone()).prop_map(|(c, k)| Op::Release { c, k }),
        1 => (c, k).prop_map(|(c, k)| Op::Read { c, k }),
    ]
}

/// The reference model of one key: who holds it with which fence and payload.
#[derive(Default, Clone)]
struct KeyModel {
    live: Option<(usize, Fence, Payload)>,
    last_fence: Option<Fence>,
}

struct Failed {
    step: usize,
    what: String,
}

impl fmt::Display for Failed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "step {}: {}", self.step, self.what)
    }
}

/// Runs one case on fresh keys; nothing expires inside a case (long TTL, no
/// time passes), so the model is exact.
async fn run_case(h: &dyn Harness, cs: &[Arc<dyn LeaseBackend>], ops: &[Op]) -> Result<(), Failed> {
    let fail = |step: usize, what: String| Failed { step, what };
    let ttl = long_ttl(&cs[0].capabilities());
    let holders: Vec<HolderId> = (0..CLIENTS).map(|_| HolderId::random()).collect();
    let keys: Vec<LeaseKey> = (0..KEYS).map(|k| key(&format!("model-{k}"))).collect();
    let mut model = vec![KeyModel::default(); KEYS];
    let mut grants: HashMap<(usize, usize), Grant> = HashMap::new();
    let _ = h;
    let mut result = Ok(());

    for (step, op) in ops.iter().enumerate() {
        let checked: Result<(), String> = async {
            match *op {
                Op::Acquire { c, k } => {
                    let p = Payload::new(vec![c as u8, step as u8]).unwrap_or_default();
                    let r = lease_core::AcquireRequest::new(keys[k].clone(), holders[c].clone())
                        .ttl(ttl)
                        .payload(p.clone());
                    let got = cs[c]
                        .try_acquire(r)
                        .await
                        .map_err(|e| format!("{op:?}: error {e}"))?;
                    let m = &mut model[k];
                    match (&m.live, got) {
                        (Some((o, f, _)), Acquire::Granted(g)) if *o == c => {
                            if g.fence() != *f {
                                return Err(format!(
                                    "{op:?}: re-acquire returned fence {} instead of {f}",
                                    g.fence()
                                ));
                            }
                            m.live = Some((c, *f, p));
                            grants.insert((c, k), g);
                        }
                        (Some((o, f, _)), Acquire::Granted(g)) => {
                            return Err(format!(
                                "{op:?}: granted fence {} while client {o} holds fence {f}",
                                g.fence()
                            ));
                        }
                        (Some((o, f, lp)), Acquire::Held(held)) => {
                            if *o == c {
                                return Err(format!(
                                    "{op:?}: refused its own live grant (fence {f})"
                                ));
                            }
                            if held.holder != holders[*o] || held.fence != *f || held.payload != *lp
                            {
                                return Err(format!(
                                    "{op:?}: refusal names {} / {}, model says client {o} / {f}",
                                    held.holder, held.fence
                                ));
                            }
                        }
                        (None, Acquire::Granted(g)) => {
                            if let Some(last) = m.last_fence {
                                if g.fence() <= last {
                                    return Err(format!(
                                        "{op:?}: fence {} is not above the previous {last}",
                                        g.fence()
                                    ));
                                }
                            }
                            m.last_fence = Some(g.fence());
                            m.live = Some((c, g.fence(), p));
                            grants.insert((c, k), g);
                        }
                        (None, Acquire::Held(held)) => {
                            return Err(format!(
                                "{op:?}: refused a free key, said {} holds fence {}",
                                held.holder, held.fence
                            ));
                        }
                    }
                }
                Op::Renew { c, k, new_payload } => {
                    let Some(g) = grants.get(&(c, k)).cloned() else {
                        return Ok(());
                    };
                    let p = new_payload
                        .then(|| Payload::new(vec![9, c as u8, step as u8]).unwrap_or_default());
                    let got = cs[c]
                        .renew(&g, p.clone())
                        .await
                        .map_err(|e| format!("{op:?}: error {e}"))?;
                    let m = &mut model[k];
                    let ours = matches!(&m.live, Some((o, f, _)) if *o == c && *f == g.fence());
                    match (ours, got) {
                        (true, Renewal::Renewed(g2)) => {
                            if g2.fence() != g.fence() {
                                return Err(format!(
                                    "{op:?}: renew changed fence {} → {}",
                                    g.fence(),
                                    g2.fence()
                                ));
                            }
                            if let (Some(p), Some(live)) = (p, m.live.as_mut()) {
                                live.2 = p;
                            }
                            grants.insert((c, k), g2);
                        }
                        (true, Renewal::Lost) => {
                            return Err(format!(
                                "{op:?}: live grant (fence {}) reported Lost",
                                g.fence()
                            ))
                        }
                        (false, Renewal::Renewed(_)) => {
                            return Err(format!(
                                "{op:?}: renew of a stale grant (fence {}) succeeded",
                                g.fence()
                            ))
                        }
                        (false, Renewal::Lost) => {}
                    }
                }
                Op::Release { c, k } => {
                    let Some(g) = grants.get(&(c, k)).cloned() else {
                        return Ok(());
                    };
                    cs[c]
                        .release(&g)
                        .await
                        .map_err(|e| format!("{op:?}: error {e}"))?;
                    let m = &mut model[k];
                    if matches!(&m.live, Some((o, f, _)) if *o == c && *f == g.fence()) {
                        m.live = None;
                    }
                }
                Op::Read { c, k } => {
                    let got = cs[c]
                        .read(&keys[k])
                        .await
                        .map_err(|e| format!("{op:?}: error {e}"))?;
                    let ok = match (&model[k].live, &got) {
                        (None, LeaseState::Free) => true,
                        (Some((o, f, p)), LeaseState::Held(held)) => {
                            held.holder == holders[*o] && held.fence == *f && held.payload == *p
                        }
                        _ => false,
                    };
                    if !ok {
                        let want = model[k].live.as_ref().map(|(o, f, _)| (o, f));
                        return Err(format!(
                            "{op:?}: read {got:?}, model says (client, fence) {want:?}"
                        ));
                    }
                }
            }
            Ok(())
        }
        .await;
        if let Err(what) = checked {
            result = Err(fail(step, what));
            break;
        }
    }
    // Leave nothing live behind on shared servers (failures here are not the
    // property's business).
    for ((c, k), g) in &grants {
        if matches!(&model[*k].live, Some((o, f, _)) if o == c && *f == g.fence()) {
            let _ = cs[*c].release(g).await;
        }
    }
    result
}

/// Random interleavings of acquire, renew, release and read from three
/// clients over two keys, every outcome checked against a reference model;
/// a failing case is shrunk to a minimal sequence of operations.
pub fn model_interleavings(h: &dyn Harness) -> PropFuture<'_> {
    Box::pin(async move {
        let cs = clients(h, CLIENTS).await?;
        let cases = h.model_cases();
        let mut runner = TestRunner::new(Config {
            cases,
            failure_persistence: None,
            ..Config::default()
        });
        let strategy = proptest::collection::vec(op(), 1..24);
        for _ in 0..cases {
            let mut tree = strategy
                .new_tree(&mut runner)
                .map_err(|e| Failure(format!("proptest could not generate a case: {e}")))?;
            let Err(first) = run_case(h, &cs, &tree.current()).await else {
                continue;
            };
            // Shrink: keep simplifying while the case still fails.
            let mut best = (tree.current(), first);
            let mut budget = 512;
            let mut more = tree.simplify();
            while more && budget > 0 {
                budget -= 1;
                more = match run_case(h, &cs, &tree.current()).await {
                    Err(f) => {
                        best = (tree.current(), f);
                        tree.simplify()
                    }
                    Ok(()) => tree.complicate(),
                };
            }
            let (ops, failed) = best;
            let trace = ops
                .iter()
                .take(failed.step + 1)
                .map(|o| format!("{o:?}"))
                .collect::<Vec<_>>()
                .join(", ");
            return Err(Failure(format!(
                "model violated at {failed}; minimal ops: [{trace}]"
            )));
        }
        Ok(Outcome::Passed)
    })
}
