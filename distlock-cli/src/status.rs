//! `distlock status`: whether a lock is held and, where the backend can
//! tell, who holds it, the holder's fencing token, its lease's time left
//! and the number of waiters.

use std::time::Duration;

use clap::Args;
use distlock::{Access, LockInfo, RwLockInfo, SemaphoreInfo};

use crate::exit;

/// Arguments of `distlock status`.
#[derive(Args)]
pub(crate) struct StatusArgs {
    /// The lock service, as for `distlock run`.
    #[arg(long, env = "DISTLOCK_URL", hide_env_values = true)]
    url: String,
    /// Print one JSON object (`name`, `backend`, `held`, `holder`
    /// {`identity`, `value`, `since`}, `fencing_token`, `expires_in_ms`,
    /// `waiters`; `null` where the backend cannot tell). With
    /// `--semaphore`: `name`, `backend`, `limit`, `permits` [{`slot`,
    /// `fencing_token`, `expires_in_ms`, `holder`}], `waiters`. With
    /// `--rw`: `name`, `backend`, `mode` (`read`, `write` or `null`),
    /// `holders` [{`access`, `fencing_token`, `expires_in_ms`, `holder`}],
    /// `fencing_token`, `waiting_writers`, `waiting_readers`.
    #[arg(long)]
    json: bool,
    /// Show the semaphore of this name (its limit and its permits) instead
    /// of the lock.
    #[arg(long, conflicts_with = "rw")]
    semaphore: bool,
    /// Show the reader-writer lock of this name (its mode, its holders and
    /// the writers waiting) instead of the lock.
    #[arg(long)]
    rw: bool,
    /// The lock (or semaphore) name.
    name: String,
}

/// Print the state of `args.name`, returning the exit code: 0 when it was
/// read (held or not), 69 when it could not be.
pub(crate) async fn status(args: StatusArgs) -> u8 {
    let locks = match distlock::connect(&args.url).await {
        Ok(locks) => locks,
        Err(e) => return exit::failed(&e),
    };
    let backend = locks.capabilities().backend;
    if args.rw {
        return match locks.inspect_rw(&args.name).await {
            Ok(info) if args.json => {
                println!("{}", rw_json(&args.name, backend, &info));
                0
            }
            Ok(info) => {
                print!("{}", rw_text(&args.name, backend, &info));
                0
            }
            Err(e) => exit::failed(&e),
        };
    }
    if args.semaphore {
        return match locks.inspect_semaphore(&args.name).await {
            Ok(info) if args.json => {
                println!("{}", semaphore_json(&args.name, backend, &info));
                0
            }
            Ok(info) => {
                print!("{}", semaphore_text(&args.name, backend, &info));
                0
            }
            Err(e) => exit::failed(&e),
        };
    }
    match locks.inspect(&args.name).await {
        Ok(info) if args.json => {
            println!("{}", as_json(&args.name, backend, &info));
            0
        }
        Ok(info) => {
            print!("{}", as_text(&args.name, backend, &info));
            0
        }
        Err(e) => exit::failed(&e),
    }
}

/// The human-readable report.
pub(crate) fn as_text(name: &str, backend: &str, info: &LockInfo) -> String {
    let state = if info.held { "held" } else { "free" };
    let mut out = format!("lock {name:?} on {backend}: {state}\n");
    if info.held {
        if let Some(holder) = &info.holder {
            out.push_str(&format!(
                "  held by        {} since {}\n",
                holder.identity,
                humantime::format_rfc3339_seconds(holder.since)
            ));
            if !holder.value.is_empty() {
                out.push_str(&format!("  value          {}\n", value_text(&holder.value)));
            }
        }
        if let Some(token) = info.fencing_token {
            out.push_str(&format!("  fencing token  {token}\n"));
        }
        if let Some(left) = info.expires_in {
            let left = Duration::from_millis(left.as_millis() as u64);
            out.push_str(&format!(
                "  lease left     {}\n",
                humantime::format_duration(left)
            ));
        }
    }
    if let Some(waiters) = info.waiters {
        out.push_str(&format!("  waiters        {waiters}\n"));
    }
    out
}

/// The human-readable report of a semaphore: its limit, then a line per
/// permit (slot, holder, token, lease left).
pub(crate) fn semaphore_text(name: &str, backend: &str, info: &SemaphoreInfo) -> String {
    let mut out = match info.limit {
        Some(limit) => format!(
            "semaphore {name:?} on {backend}: {} of {limit} permits held\n",
            info.permits.len()
        ),
        None => format!("semaphore {name:?} on {backend}: free\n"),
    };
    for permit in &info.permits {
        let mut line = format!("  slot {:<4}", permit.slot);
        if let Some(holder) = &permit.holder {
            line.push_str(&format!(
                " held by {} since {}",
                holder.identity,
                humantime::format_rfc3339_seconds(holder.since)
            ));
        }
        if let Some(token) = permit.fencing_token {
            line.push_str(&format!(", token {token}"));
        }
        if let Some(left) = permit.expires_in {
            let left = Duration::from_millis(left.as_millis() as u64);
            line.push_str(&format!(", {} left", humantime::format_duration(left)));
        }
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(waiters) = info.waiters {
        out.push_str(&format!("  waiters   {waiters}\n"));
    }
    out
}

/// The human-readable report of a reader-writer lock: its mode, then a
/// line per holder (access, holder, token, lease left), then the waiting
/// writers and readers where the backend can tell.
pub(crate) fn rw_text(name: &str, backend: &str, info: &RwLockInfo) -> String {
    let mut out = match info.mode {
        Some(Access::Write) => format!(
            "reader-writer lock {name:?} on {backend}: held by a writer
"
        ),
        Some(_) => format!(
            "reader-writer lock {name:?} on {backend}: held by {} reader{}
",
            info.holders.len(),
            if info.holders.len() == 1 { "" } else { "s" }
        ),
        None => format!(
            "reader-writer lock {name:?} on {backend}: free
"
        ),
    };
    for h in &info.holders {
        let mut parts = Vec::new();
        if let Some(holder) = &h.holder {
            parts.push(format!(
                "held by {} since {}",
                holder.identity,
                humantime::format_rfc3339_seconds(holder.since)
            ));
        }
        if let Some(token) = h.fencing_token {
            parts.push(format!("token {token}"));
        }
        if let Some(left) = h.expires_in {
            let left = Duration::from_millis(left.as_millis() as u64);
            parts.push(format!("{} left", humantime::format_duration(left)));
        }
        let line = format!("  {:<5} {}", h.access.as_str(), parts.join(", "));
        out.push_str(&line);
        out.push('\n');
    }
    if let Some(writers) = info.waiting_writers {
        out.push_str(&format!("  waiting writers  {writers}\n"));
    }
    if let Some(readers) = info.waiting_readers {
        out.push_str(&format!("  waiting readers  {readers}\n"));
    }
    out
}

/// The JSON report of a reader-writer lock.
pub(crate) fn rw_json(name: &str, backend: &str, info: &RwLockInfo) -> serde_json::Value {
    let holders: Vec<serde_json::Value> = info
        .holders
        .iter()
        .map(|h| {
            serde_json::json!({
                "access": h.access.as_str(),
                "fencing_token": h.fencing_token,
                "expires_in_ms": h.expires_in.map(|d| d.as_millis() as u64),
                "holder": h.holder.as_ref().map(holder_json),
            })
        })
        .collect();
    serde_json::json!({
        "name": name,
        "backend": backend,
        "mode": info.mode.map(Access::as_str),
        "holders": holders,
        "fencing_token": info.fencing_token,
        "waiting_writers": info.waiting_writers,
        "waiting_readers": info.waiting_readers,
    })
}

/// The JSON report of a semaphore.
pub(crate) fn semaphore_json(name: &str, backend: &str, info: &SemaphoreInfo) -> serde_json::Value {
    let permits: Vec<serde_json::Value> = info
        .permits
        .iter()
        .map(|p| {
            serde_json::json!({
                "slot": p.slot,
                "fencing_token": p.fencing_token,
                "expires_in_ms": p.expires_in.map(|d| d.as_millis() as u64),
                "holder": p.holder.as_ref().map(holder_json),
            })
        })
        .collect();
    serde_json::json!({
        "name": name,
        "backend": backend,
        "limit": info.limit,
        "permits": permits,
        "waiters": info.waiters,
    })
}

/// A holder's value as text: UTF-8 as it is (quoted), else its length.
pub(crate) fn value_text(value: &[u8]) -> String {
    match std::str::from_utf8(value) {
        Ok(text) => format!("{text:?}"),
        Err(_) => format!("({} bytes, not UTF-8)", value.len()),
    }
}

/// A holder record as JSON: `identity`, `value` (text, or `null` when not
/// UTF-8), `value_bytes`, `since` (RFC 3339).
pub(crate) fn holder_json(holder: &distlock::Holder) -> serde_json::Value {
    serde_json::json!({
        "identity": holder.identity,
        "value": holder.value_str(),
        "value_bytes": holder.value.len(),
        "since": humantime::format_rfc3339_millis(holder.since).to_string(),
    })
}

/// One line on the holder, for the spinner of `distlock run`: `held
/// (token 42, 12s left), 1 waiting`.
pub(crate) fn held_by(info: &LockInfo) -> String {
    let mut out = String::from(if info.held { "held" } else { "free" });
    let mut details = Vec::new();
    if info.held {
        if let Some(token) = info.fencing_token {
            details.push(format!("token {token}"));
        }
        if let Some(left) = info.expires_in {
            let left = Duration::from_secs(left.as_secs());
            details.push(format!("{} left", humantime::format_duration(left)));
        }
    }
    if !details.is_empty() {
        out.push_str(&format!(" ({})", details.join(", ")));
    }
    if let Some(waiters) = info.waiters {
        out.push_str(&format!(", {waiters} waiting"));
    }
    out
}

/// The JSON report.
pub(crate) fn as_json(name: &str, backend: &str, info: &LockInfo) -> serde_json::Value {
    serde_json::json!({
        "name": name,
        "backend": backend,
        "held": info.held,
        "holder": info.holder.as_ref().map(holder_json),
        "fencing_token": info.fencing_token,
        "expires_in_ms": info.expires_in.map(|d| d.as_millis() as u64),
        "waiters": info.waiters,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_what_the_backend_told() {
        let info = LockInfo::held()
            .with_fencing_token(Some(42))
            .with_expires_in(Some(Duration::from_millis(12_345)))
            .with_waiters(Some(2));
        let text = as_text("jobs/a", "redis", &info);
        assert_eq!(
            text,
            "lock \"jobs/a\" on redis: held\n  fencing token  42\n  lease left     12s 345ms\n  waiters        2\n"
        );
        let json = as_json("jobs/a", "redis", &info);
        assert_eq!(json["held"], true);
        assert_eq!(json["fencing_token"], 42);
        assert_eq!(json["expires_in_ms"], 12_345);
        assert_eq!(json["waiters"], 2);

        assert_eq!(held_by(&info), "held (token 42, 12s left), 2 waiting");

        let free = as_text("b", "mysql", &LockInfo::free());
        assert_eq!(held_by(&LockInfo::free()), "free");
        assert_eq!(free, "lock \"b\" on mysql: free\n");
        let json = as_json("b", "mysql", &LockInfo::free());
        assert!(json["holder"].is_null());
        assert_eq!(json["held"], false);
        assert!(json["waiters"].is_null() && json["fencing_token"].is_null());
    }

    #[test]
    fn reports_a_reader_writer_lock_as_the_backend_told() {
        let reader = |left| {
            distlock::RwHolderInfo::new(Access::Read)
                .with_fencing_token(Some(7))
                .with_expires_in(Some(Duration::from_millis(left)))
        };
        let info = RwLockInfo::held(vec![reader(2_000), reader(3_000)])
            .with_fencing_token(Some(7))
            .with_waiting(Some(1), None);
        assert_eq!(
            rw_text("data", "redis", &info),
            "reader-writer lock \"data\" on redis: held by 2 readers\n  \
             read  token 7, 2s left\n  read  token 7, 3s left\n  waiting writers  1\n"
        );
        let json = rw_json("data", "redis", &info);
        assert_eq!(json["mode"], "read");
        assert_eq!(json["holders"][1]["access"], "read");
        assert_eq!(json["waiting_writers"], 1);
        assert!(json["waiting_readers"].is_null());
        let free = rw_json("data", "redis", &RwLockInfo::free());
        assert!(free["mode"].is_null());
        assert_eq!(
            rw_text("data", "sqlite", &RwLockInfo::free()),
            "reader-writer lock \"data\" on sqlite: free\n"
        );
    }

    #[test]
    fn reports_a_semaphore_as_the_backend_told() {
        let info = SemaphoreInfo::held(
            3,
            vec![
                distlock::PermitInfo::new(2)
                    .with_fencing_token(Some(9))
                    .with_expires_in(Some(Duration::from_millis(4_000))),
                distlock::PermitInfo::new(0).with_fencing_token(Some(7)),
            ],
        )
        .with_waiters(Some(1));
        assert_eq!(
            semaphore_text("pool", "redis", &info),
            "semaphore \"pool\" on redis: 2 of 3 permits held\n  \
             slot 0   , token 7\n  slot 2   , token 9, 4s left\n  waiters   1\n"
        );
        let json = semaphore_json("pool", "redis", &info);
        assert_eq!(json["limit"], 3);
        assert_eq!(json["permits"][1]["slot"], 2);
        assert_eq!(json["permits"][1]["expires_in_ms"], 4_000);
        assert_eq!(json["waiters"], 1);
        assert_eq!(
            semaphore_text("pool", "etcd", &SemaphoreInfo::free()),
            "semaphore \"pool\" on etcd: free\n"
        );
    }
}
