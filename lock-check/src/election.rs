//! What an election run's observers saw, checked against what the
//! candidates published: an observer must never see a term go back, and
//! every state it sees must be one a leader published (its campaign's
//! value or a value it proclaimed, with its own term).
//!
//! Two leaders believing at once, term order and fencing are the lock's
//! findings ([`crate::analysis`]): a candidate's grant is a hold whose
//! token is the term.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::analysis::Finding;
use crate::event::{Event, Stamped};

/// The election part of a run's report.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ElectionReport {
    /// Observer processes that logged anything.
    pub observers: u64,
    /// States the observers logged (a leader or no leader).
    pub observations: u64,
    /// Distinct terms the observers saw, of the grants the candidates
    /// logged.
    pub terms_seen: (u64, u64),
    /// Error items of the observer streams, by `LockError` kind (each is
    /// followed by more reading).
    pub observe_errors: BTreeMap<String, u64>,
    /// Error items that were not transient (a reply the client could not
    /// read as a state, say): each is a failure.
    pub observe_errors_not_transient: Finding,
    /// Proclaims attempted, and how many were answered as published.
    pub proclaims: (u64, u64),
    /// States whose term was lower than one the same observer had seen
    /// before.
    pub terms_backwards: Finding,
    /// States no leader published: a value nobody campaigned or
    /// proclaimed with, a proclaimed value under another term than its
    /// leader's, or a campaign's value under a term later than the one it
    /// won.
    pub unpublished: Finding,
}

/// Who published a value, by what the candidates logged.
enum Published {
    /// A campaign's value; its term if the grant was logged (the server
    /// may have granted it without the candidate logging it: killed at
    /// that moment, or an answer lost).
    Campaign { worker: u32, term: Option<u64> },
    /// A proclaimed value, under its leader's term.
    Proclaim { worker: u32, term: u64 },
}

/// Check the observers' logs (`observers`: worker number and events)
/// against the candidates' (`candidates`).
pub(crate) fn analyse(
    candidates: &[(u32, &[Stamped<Event>])],
    observers: &[(u32, &[Stamped<Event>])],
) -> ElectionReport {
    let mut r = ElectionReport::default();
    let mut published: BTreeMap<&str, Published> = BTreeMap::new();
    let mut granted_terms = std::collections::BTreeSet::new();
    for (worker, events) in candidates {
        let mut campaign: Option<&str> = None;
        let mut proclaiming = false;
        for e in *events {
            match &e.event {
                Event::Acquiring { value, .. } => {
                    campaign = value.as_deref();
                    if let Some(v) = campaign {
                        published.insert(
                            v,
                            Published::Campaign {
                                worker: *worker,
                                term: None,
                            },
                        );
                    }
                }
                Event::Granted {
                    token: Some(term), ..
                } => {
                    granted_terms.insert(*term);
                    if let Some(Published::Campaign { term: t, .. }) =
                        campaign.and_then(|v| published.get_mut(v))
                    {
                        *t = Some(*term);
                    }
                }
                Event::Proclaiming { term, value } => {
                    r.proclaims.0 += 1;
                    proclaiming = true;
                    published.insert(
                        value,
                        Published::Proclaim {
                            worker: *worker,
                            term: *term,
                        },
                    );
                }
                Event::Proclaimed { error } if proclaiming => {
                    proclaiming = false;
                    if error.is_none() {
                        r.proclaims.1 += 1;
                    }
                }
                _ => {}
            }
        }
    }
    let mut seen_terms = std::collections::BTreeSet::new();
    for (observer, events) in observers {
        if !events.is_empty() {
            r.observers += 1;
        }
        let mut highest: Option<u64> = None;
        for e in *events {
            match &e.event {
                Event::Observed { term, value } => {
                    r.observations += 1;
                    let Some(term) = *term else { continue };
                    seen_terms.insert(term);
                    if let Some(h) = highest
                        && term < h
                    {
                        r.terms_backwards
                            .add(|| format!("observer {observer} saw term {term} after term {h}"));
                    }
                    highest = Some(highest.map_or(term, |h| h.max(term)));
                    let value = value.as_deref().unwrap_or("");
                    if let Some(why) = unpublished(published.get(value), term) {
                        r.unpublished.add(|| {
                            format!("observer {observer} saw term {term}, value {value:?}: {why}")
                        });
                    }
                }
                Event::ObserveFailed {
                    kind,
                    error,
                    transient,
                } => {
                    *r.observe_errors.entry(kind.clone()).or_default() += 1;
                    if !transient {
                        r.observe_errors_not_transient
                            .add(|| format!("observer {observer}: {error}"));
                    }
                }
                _ => {}
            }
        }
    }
    r.terms_seen = (
        seen_terms.intersection(&granted_terms).count() as u64,
        granted_terms.len() as u64,
    );
    r
}

/// Why the state (`term`, a value published as `by`) is not one a leader
/// published, or `None` if it is.
fn unpublished(by: Option<&Published>, term: u64) -> Option<String> {
    match by {
        None => Some("no candidate campaigned or proclaimed with it".into()),
        Some(Published::Proclaim { worker, term: t }) if *t != term => Some(format!(
            "worker {worker} proclaimed it as the leader of term {t}"
        )),
        Some(Published::Campaign {
            worker,
            term: Some(t),
        }) if term > *t => Some(format!(
            "worker {worker} campaigned with it and won term {t}, not a later one"
        )),
        Some(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::HoldEnd;

    fn at(t: u64, event: Event) -> Stamped<Event> {
        Stamped { t, event }
    }

    fn observed(term: u64, value: &str) -> Event {
        Event::Observed {
            term: Some(term),
            value: Some(value.into()),
        }
    }

    #[test]
    fn a_term_going_back_and_an_unpublished_value_are_found() {
        let candidate = vec![
            at(
                1,
                Event::Acquiring {
                    wait_ms: 1,
                    end: HoldEnd::Release,
                    value: Some("w0/1".into()),
                    access: None,
                },
            ),
            at(
                2,
                Event::Granted {
                    started: 1,
                    token: Some(7),
                    deadline: None,
                    lost_on_arrival: None,
                    slot: None,
                    members: Vec::new(),
                },
            ),
            at(
                3,
                Event::Proclaiming {
                    term: 7,
                    value: "w0/1/p1".into(),
                },
            ),
            at(4, Event::Proclaimed { error: None }),
        ];
        let good = vec![
            at(
                2,
                Event::Observed {
                    term: None,
                    value: None,
                },
            ),
            at(3, observed(7, "w0/1")),
            at(5, observed(7, "w0/1/p1")),
        ];
        let r = analyse(&[(0, &candidate)], &[(1, &good)]);
        assert_eq!(r.terms_backwards.count, 0);
        assert_eq!(r.unpublished.count, 0, "{:?}", r.unpublished);
        assert_eq!(
            (r.observations, r.terms_seen, r.proclaims),
            (3, (1, 1), (1, 1))
        );

        let bad = vec![
            at(3, observed(7, "w0/1")),
            at(4, observed(6, "w0/1")),
            at(5, observed(8, "w0/1/p1")),
            at(6, observed(9, "w0/1")),
            at(7, observed(9, "nobody's")),
        ];
        let r = analyse(&[(0, &candidate)], &[(1, &bad)]);
        assert_eq!(r.terms_backwards.count, 1, "{:?}", r.terms_backwards);
        assert_eq!(r.unpublished.count, 3, "{:?}", r.unpublished);
    }
}
