//! Holds a backend crate's `docs.md` to its `capabilities()`: the crate's
//! documentation opens with a capability checklist (a Markdown table under
//! `## Capabilities`), and [`assert_checklist`] fails when a row disagrees
//! with what the backend reports, so the two cannot drift.
//!
//! The table has a `capability` column, one value column per backend the
//! crate provides (headed by its `Capabilities::backend` name, or `value`
//! when there is one), and any further columns of prose:
//!
//! ```text
//! | capability | value | what it means here |
//! |---|---|---|
//! | `grade` | `Efficiency` | … |
//! ```

use std::collections::BTreeMap;

use lock_core::Capabilities;

/// The checklist's rows: each names a field of [`Capabilities`] and shows
/// its value as the field's `Debug` form; `semaphore` as `None`, or as
/// `LIMIT, fair|unordered, WAITING` (the largest limit, whether waiters are
/// served in arrival order, and how they learn of a release); `rw_lock` as
/// `None`, or as `writers-first|unordered-writers, fair|unordered,
/// WAITING` (whether a waiting writer blocks later readers, whether
/// waiters are served in arrival order, how they learn of a release),
/// followed by `, upgradeable` where upgradeable reads are offered.
pub const CHECKLIST: [&str; 14] = [
    "grade",
    "fencing",
    "fair_queue",
    "crash_release",
    "survives_server_failure",
    "depends_on_clocks",
    "waiting",
    "holder",
    "observers",
    "semaphore",
    "lock_delay",
    "hold_at_least",
    "atomic_sets",
    "rw_lock",
];

/// `caps`' checklist values, as `docs.md` writes them.
pub fn checklist_of(caps: &Capabilities) -> BTreeMap<&'static str, String> {
    let values = [
        format!("{:?}", caps.grade),
        format!("{:?}", caps.fencing),
        caps.fair_queue.to_string(),
        format!("{:?}", caps.crash_release),
        caps.survives_server_failure.to_string(),
        caps.depends_on_clocks.to_string(),
        format!("{:?}", caps.waiting),
        caps.holder.to_string(),
        format!("{:?}", caps.observers),
        caps.semaphore.map_or_else(
            || "None".to_string(),
            |s| {
                let order = if s.fair_queue { "fair" } else { "unordered" };
                format!("{}, {order}, {:?}", s.max_limit, s.waiting)
            },
        ),
        caps.lock_delay.to_string(),
        caps.hold_at_least.to_string(),
        caps.atomic_sets.to_string(),
        caps.rw_lock.map_or_else(
            || "None".to_string(),
            |rw| {
                let writers = if rw.writer_preference {
                    "writers-first"
                } else {
                    "unordered-writers"
                };
                let order = if rw.fair_queue { "fair" } else { "unordered" };
                let upgradeable = if rw.upgradeable { ", upgradeable" } else { "" };
                format!("{writers}, {order}, {:?}{upgradeable}", rw.waiting)
            },
        ),
    ];
    CHECKLIST.into_iter().zip(values).collect()
}

/// The cells of a Markdown table row, trimmed, without the backticks of
/// inline code.
fn cells(line: &str) -> Vec<String> {
    let line = line.trim();
    let line = line.strip_prefix('|').unwrap_or(line);
    let line = line.strip_suffix('|').unwrap_or(line);
    line.split('|')
        .map(|c| c.trim().trim_matches('`').to_string())
        .collect()
}

/// The checklist `docs` states for `backend`: the table under the first
/// `## Capabilities` heading, read from the column headed `backend` (or
/// `value`). Panics, naming what is missing, when there is no such table
/// or column.
pub fn checklist_in(docs: &str, backend: &str) -> BTreeMap<String, String> {
    let mut lines = docs
        .lines()
        .skip_while(|l| l.trim() != "## Capabilities")
        .skip(1)
        .skip_while(|l| !l.trim_start().starts_with('|'));
    let header = cells(
        lines
            .next()
            .expect("docs.md has no `## Capabilities` table"),
    );
    let column = header
        .iter()
        .position(|h| h == backend)
        .or_else(|| header.iter().position(|h| h == "value"))
        .unwrap_or_else(|| {
            panic!("the checklist has no column `{backend}` or `value`: {header:?}")
        });
    lines
        .skip(1) // the |---| row
        .take_while(|l| l.trim_start().starts_with('|'))
        .map(|l| {
            let row = cells(l);
            let value = row.get(column).cloned().unwrap_or_default();
            (row[0].clone(), value)
        })
        .collect()
}

/// Assert that `docs` opens with a capability checklist and that its
/// column for `caps.backend` states exactly `caps`: every field of
/// [`CHECKLIST`], in that order, with the backend's value.
pub fn assert_checklist(docs: &str, caps: &Capabilities) {
    assert_checklist_column(docs, caps.backend, caps);
}

/// [`assert_checklist`] for a backend whose capabilities differ by
/// configuration (Postgres's row and advisory modes), each in a column of
/// its own: the column headed `column` must state exactly `caps`.
pub fn assert_checklist_column(docs: &str, column: &str, caps: &Capabilities) {
    let first_heading = docs.lines().find(|l| l.starts_with("## "));
    assert_eq!(
        first_heading.map(str::trim),
        Some("## Capabilities"),
        "docs.md must open with its capability checklist"
    );
    let stated = checklist_in(docs, column);
    let rows: Vec<&str> = stated.keys().map(String::as_str).collect();
    let mut expected: Vec<&str> = CHECKLIST.to_vec();
    expected.sort_unstable();
    assert_eq!(rows, expected, "the checklist's rows");
    for (field, value) in checklist_of(caps) {
        assert_eq!(
            stated[field], value,
            "docs.md says `{field}` is `{}` for {column}, capabilities() says `{value}`",
            stated[field]
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use lock_core::{DistributedLock, MemoryLock};

    const DOCS: &str = "# x\n\nProse.\n\n## Capabilities\n\n\
        | capability | memory | other | note |\n|---|---|---|---|\n\
        | `grade` | `ProcessLocal` | `Efficiency` | a |\n\
        | `fencing` | `Safe` | `None` | |\n\
        | `fair_queue` | `true` | `false` | |\n\
        | `crash_release` | `ProcessExit` | `Ttl` | |\n\
        | `survives_server_failure` | `false` | `false` | |\n\
        | `depends_on_clocks` | `false` | `true` | |\n\
        | `waiting` | `Notified` | `Polling` | |\n\
        | `holder` | `true` | `false` | |\n\
        | `observers` | `Notified` | `Polling` | |\n\
        | `semaphore` | `4096, fair, Notified` | `None` | |\n\
        | `lock_delay` | `true` | `false` | |\n\
        | `hold_at_least` | `true` | `false` | |\n\
        | `atomic_sets` | `1024` | `0` | |\n\
        | `rw_lock` | `writers-first, fair, Notified, upgradeable` | `None` | |\n\nMore.\n";

    #[test]
    fn a_true_checklist_passes_and_its_columns_are_read_by_backend() {
        let caps = MemoryLock::new().capabilities();
        assert_checklist(DOCS, &caps);
        assert_eq!(checklist_in(DOCS, "other")["waiting"], "Polling");
    }

    #[test]
    #[should_panic(expected = "docs.md says `fair_queue` is `false`")]
    fn a_row_that_drifted_fails() {
        let caps = MemoryLock::new().capabilities();
        assert_checklist(
            &DOCS.replace("`true` | `false`", "`false` | `false`"),
            &caps,
        );
    }

    #[test]
    #[should_panic(expected = "the checklist's rows")]
    fn a_missing_row_fails() {
        let caps = MemoryLock::new().capabilities();
        let docs: String = DOCS
            .lines()
            .filter(|l| !l.contains("`waiting`"))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_checklist(&docs, &caps);
    }
}
