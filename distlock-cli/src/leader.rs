//! `distlock leader`: an election's leader (term, identity, value) and,
//! with `--watch`, every change as it is seen.

use std::time::Duration;

use clap::Args;
use distlock::{Election, Leader};
use futures_util::StreamExt;

use crate::exit;
use crate::status::value_text;

/// Arguments of `distlock leader`.
#[derive(Args)]
pub(crate) struct LeaderArgs {
    /// The lock service, as for `distlock run`.
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// Keep printing every change (new leader, new value, no leader) until
    /// interrupted; a failed read is reported on stderr and reading goes on.
    #[arg(long)]
    watch: bool,
    /// How often to read the election again with --watch, where the
    /// backend does not notify observers (e.g. 250ms, 2s).
    #[arg(long, default_value = "250ms", value_parser = humantime::parse_duration)]
    poll: Duration,
    /// Print one JSON object per state (`name`, `backend`, `leader`:
    /// `null` or {`term`, `identity`, `value`, `value_bytes`, `since`}).
    #[arg(long)]
    json: bool,
    /// The election's name.
    name: String,
}

/// Print the leader of `args.name` (and with --watch its changes): 0 when
/// it was read, 69 when it could not be, 78 for bad input.
pub(crate) async fn leader(args: LeaderArgs) -> u8 {
    let locks = match distlock::connect(&args.url).await {
        Ok(locks) => locks,
        Err(e) => return exit::failed(&e),
    };
    let backend = locks.capabilities().backend;
    let election = Election::new(locks, args.name.clone()).poll_interval(args.poll);
    let show = |now: &Option<Leader>| {
        if args.json {
            println!("{}", as_json(&args.name, backend, now.as_ref()));
        } else {
            println!("{}", as_text(&args.name, now.as_ref()));
        }
    };
    if !args.watch {
        return match election.leader().await {
            Ok(now) => {
                show(&now);
                0
            }
            Err(e) => exit::failed(&e),
        };
    }
    let mut changes = Box::pin(election.observe());
    let mut seen_once = false;
    while let Some(change) = changes.next().await {
        match change {
            Ok(now) => {
                seen_once = true;
                show(&now);
            }
            // Bad input ends it; a server's trouble is reported and read
            // again.
            Err(e) if !seen_once && !e.is_transient() => return exit::failed(&e),
            Err(e) => {
                tracing::warn!(target: "distlock", error = %e.report(), "reading the election failed; reading again")
            }
        }
    }
    0
}

/// `election "x": term 12, led by api-2 (pid 4312, api) since …, value "…"`,
/// or `election "x": no leader`.
pub(crate) fn as_text(name: &str, leader: Option<&Leader>) -> String {
    let Some(l) = leader else {
        return format!("election {name:?}: no leader");
    };
    let mut out = format!("election {name:?}: term {}, led by {}", l.term, l.identity);
    if let Some(since) = l.since {
        out.push_str(&format!(
            " since {}",
            humantime::format_rfc3339_seconds(since)
        ));
    }
    if !l.value.is_empty() {
        out.push_str(&format!(", value {}", value_text(&l.value)));
    }
    out
}

/// The JSON form of one state.
pub(crate) fn as_json(name: &str, backend: &str, leader: Option<&Leader>) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "backend": backend,
        "leader": leader.map(|l| serde_json::json!({
            "term": l.term,
            "identity": l.identity,
            "value": l.value_str(),
            "value_bytes": l.value.len(),
            "since": l.since.map(|t| humantime::format_rfc3339_millis(t).to_string()),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_leader_reads_as_one_line_and_as_json() {
        assert_eq!(as_text("jobs", None), "election \"jobs\": no leader");
        let json = as_json("jobs", "etcd", None);
        assert!(json["leader"].is_null());
    }
}
