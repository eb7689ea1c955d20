//! Which node a Sentinel group's master is, by a majority of its
//! Sentinels: every Sentinel is asked (`SENTINEL MASTER GROUP`) and the
//! master named with the highest configuration epoch is the one.
//!
//! redis-rs's own lookup takes the first Sentinel that names a master
//! answering `ROLE` as one. A Sentinel that missed a failover (paused,
//! partitioned) still names the old master with the old configuration
//! epoch, and an old master restarted with its data answers as a master
//! until the Sentinels make it a replica: a client asking that Sentinel
//! first would take its locks there, beside the promoted replica. The
//! configuration epoch orders the Sentinels' views (each failover takes a
//! new one), and a majority of answers keeps a lone stale Sentinel from
//! deciding.

use std::collections::HashMap;
use std::time::Duration;

use redis::RedisError;

/// One Sentinel's view of the group's master.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Named {
    /// The master's host as the Sentinels announce it.
    pub(crate) host: String,
    /// Its port.
    pub(crate) port: u16,
    /// The configuration epoch of that view.
    pub(crate) epoch: u64,
    /// Whether the Sentinel holds that master down (`s_down`, `o_down`).
    pub(crate) down: bool,
}

/// What one Sentinel answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Answer {
    /// No answer in time, or an error.
    Silent,
    /// It answered, but knows no such group (or the reply lacks a field).
    NoMaster,
    /// The master it names.
    Names(Named),
}

/// The Sentinels of one group, each with a client of its own.
pub(crate) struct Sentinels {
    clients: Vec<redis::Client>,
}

impl Sentinels {
    /// The Sentinels at `addresses` (TLS where an address says so; the
    /// Sentinels themselves take no credentials).
    pub(crate) fn new(addresses: &[redis::ConnectionAddr]) -> Result<Self, RedisError> {
        let clients = addresses
            .iter()
            .map(|addr| redis::Client::open(addr.clone()))
            .collect::<Result<_, _>>()?;
        Ok(Sentinels { clients })
    }

    /// Every Sentinel's answer for `group`, asked side by side, each within
    /// `limit`.
    pub(crate) async fn ask(&self, group: &str, limit: Duration) -> Vec<Answer> {
        futures_util::future::join_all(self.clients.iter().map(|client| async move {
            let asked = async {
                let mut conn = client.get_multiplexed_async_connection().await?;
                redis::cmd("SENTINEL")
                    .arg("MASTER")
                    .arg(group)
                    .query_async::<HashMap<String, String>>(&mut conn)
                    .await
            };
            match tokio::time::timeout(limit, asked).await {
                Ok(Ok(master)) => answer_of(&master),
                // "No such master with that name": it answered.
                Ok(Err(e)) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Answer::NoMaster,
                _ => Answer::Silent,
            }
        }))
        .await
    }
}

/// A Sentinel's `SENTINEL MASTER` reply as an [`Answer`]: the master it
/// names, held down or not (a Sentinel that just switched to a new master
/// flags it `disconnected` until its links are up: that is not down).
fn answer_of(master: &HashMap<String, String>) -> Answer {
    let named = || {
        let flags = master.get("flags")?;
        Some(Named {
            host: master.get("ip")?.clone(),
            port: master.get("port")?.parse().ok()?,
            epoch: master.get("config-epoch")?.parse().ok()?,
            down: flags.split(',').any(|f| matches!(f, "s_down" | "o_down")),
        })
    };
    named().map_or(Answer::NoMaster, Answer::Names)
}

/// The master `answers` stand for: the one named with the highest
/// configuration epoch, if more than half of the Sentinels answered, if
/// that epoch is not below `floor` (the epoch of the master followed so
/// far: a client never goes back to an older configuration), and if the
/// Sentinel naming it does not hold it down. Otherwise why not: an older
/// view never stands in for a newer one whose master is down.
pub(crate) fn choose(answers: &[Answer], floor: u64) -> Result<Named, String> {
    let answered = answers.iter().filter(|a| **a != Answer::Silent).count();
    if answered <= answers.len() / 2 {
        return Err(format!(
            "{answered} of {} sentinels answered, not a majority",
            answers.len()
        ));
    }
    let best = answers
        .iter()
        .filter_map(|a| match a {
            Answer::Names(named) => Some(named),
            _ => None,
        })
        .max_by_key(|named| (named.epoch, !named.down))
        .ok_or_else(|| "no sentinel that answered names a master".to_string())?;
    if best.down {
        return Err(format!(
            "the newest configuration's master {}:{} (epoch {}) is down",
            best.host, best.port, best.epoch
        ));
    }
    if best.epoch < floor {
        return Err(format!(
            "the sentinels name {}:{} of configuration epoch {}, older than the {floor} followed so far",
            best.host, best.port, best.epoch
        ));
    }
    Ok(best.clone())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(host: &str, epoch: u64) -> Answer {
        Answer::Names(Named {
            host: host.into(),
            port: 6379,
            epoch,
            down: false,
        })
    }

    fn names_down(host: &str, epoch: u64) -> Answer {
        Answer::Names(Named {
            host: host.into(),
            port: 6379,
            epoch,
            down: true,
        })
    }

    /// A Sentinel that missed a failover names the old master with the old
    /// epoch: the others' newer view wins, whatever the order.
    #[test]
    fn the_newest_configuration_wins_over_a_stale_sentinel() {
        let stale_first = [names("old", 3), names("new", 4), names("new", 4)];
        assert_eq!(choose(&stale_first, 0).expect("a master").host, "new");
        let one_silent = [names("old", 3), Answer::Silent, names("new", 4)];
        assert_eq!(choose(&one_silent, 0).expect("a master").host, "new");
    }

    /// Fewer answers than a majority decide nothing: the one that answered
    /// may be the stale one.
    #[test]
    fn a_minority_of_answers_is_refused() {
        let lone = [names("old", 3), Answer::Silent, Answer::Silent];
        assert!(choose(&lone, 0).is_err());
        let half = [names("new", 4), Answer::Silent];
        assert!(choose(&half, 0).is_err());
    }

    /// A view older than the master followed so far is refused; so is the
    /// newest view while its master is held down: the stale Sentinel's
    /// older view does not stand in for it.
    #[test]
    fn an_older_view_or_the_newest_master_down_is_refused() {
        let old = [names("old", 3), names("old", 3), Answer::Silent];
        assert!(choose(&old, 4).is_err());
        assert_eq!(choose(&old, 3).expect("the same epoch").host, "old");
        let newest_down = [names("old", 3), names_down("new", 4), names_down("new", 4)];
        assert!(choose(&newest_down, 0).is_err());
        let one_sees_it_up = [names("old", 3), names_down("new", 4), names("new", 4)];
        assert_eq!(choose(&one_sees_it_up, 0).expect("up").host, "new");
        let unknown = [Answer::NoMaster, Answer::NoMaster, names("x", 1)];
        assert_eq!(choose(&unknown, 0).expect("one names one").host, "x");
        assert!(choose(&[Answer::NoMaster, Answer::NoMaster], 0).is_err());
    }

    /// A reply's fields: the master, held down or not (`disconnected`, a
    /// Sentinel's links not up yet, is not down); a reply without an epoch
    /// names none.
    #[test]
    fn a_reply_names_its_master_and_whether_it_is_down() {
        let reply = |flags: &str| {
            HashMap::from([
                ("ip".to_string(), "10.0.0.1".to_string()),
                ("port".to_string(), "6380".to_string()),
                ("config-epoch".to_string(), "7".to_string()),
                ("flags".to_string(), flags.to_string()),
            ])
        };
        let named = |down| {
            Answer::Names(Named {
                host: "10.0.0.1".into(),
                port: 6380,
                epoch: 7,
                down,
            })
        };
        assert_eq!(answer_of(&reply("master")), named(false));
        assert_eq!(answer_of(&reply("master,disconnected")), named(false));
        assert_eq!(answer_of(&reply("s_down,master")), named(true));
        assert_eq!(answer_of(&reply("master,s_down,o_down")), named(true));
        let mut no_epoch = reply("master");
        no_epoch.remove("config-epoch");
        assert_eq!(answer_of(&no_epoch), Answer::NoMaster);
    }
}
