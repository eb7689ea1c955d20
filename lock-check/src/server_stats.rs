//! Each server's own count of the requests it has served, read from outside
//! the lock client, so a benchmark can report the traffic a client causes:
//! Redis `INFO commandstats` (script runs, `EVAL`/`EVALSHA`: every request
//! of the lock client is one, and the commands a script calls inside are
//! not requests; summed over Redlock's masters), Postgres
//! `pg_stat_database` (transactions), MariaDB/MySQL `Questions`, etcd's
//! `/metrics` (`grpc_server_msg_received_total`: unary requests and
//! the messages of streams, such as lease keep-alives) and ZooKeeper's `mntr`
//! (`zk_packets_received`). In-process backends (memory, SQLite) have no
//! server: `None`.

use std::time::Duration;

use sqlx::Connection;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// How long one reading may take.
const LIMIT: Duration = Duration::from_secs(5);

/// The requests the server(s) behind `url` have served so far, if the
/// backend has a server and it answered.
pub async fn requests_served(url: &str) -> Option<u64> {
    let scheme = url.split("://").next()?;
    let read = async {
        match scheme {
            "redis" | "rediss" => redis_script_runs(url).await,
            "redlock" => {
                let mut total = 0;
                for host in hosts(url) {
                    total += redis_script_runs(&format!("redis://{host}")).await?;
                }
                Some(total)
            }
            "postgres" | "postgresql" => postgres_transactions(url).await,
            "mysql" | "mariadb" => mysql_questions(url).await,
            "etcd" => {
                let mut total = 0;
                for host in hosts(url) {
                    total += etcd_messages(&host).await?;
                }
                Some(total)
            }
            "zk" => {
                let mut total = 0;
                for host in hosts(url) {
                    total += zk_packets(&host).await?;
                }
                Some(total)
            }
            _ => None,
        }
    };
    tokio::time::timeout(LIMIT, read).await.ok().flatten()
}

/// `host:port` of each server in a (possibly multi-host) URL.
fn hosts(url: &str) -> Vec<String> {
    let rest = url.split_once("://").map_or(url, |(_, r)| r);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, r)| r);
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    rest[..end].split(',').map(str::to_string).collect()
}

/// The URL without its query (distlock's options are not the client's).
fn without_query(url: &str) -> &str {
    url.split_once('?').map_or(url, |(u, _)| u)
}

async fn redis_script_runs(url: &str) -> Option<u64> {
    let client = redis::Client::open(without_query(url)).ok()?;
    let mut conn = client.get_multiplexed_async_connection().await.ok()?;
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query_async(&mut conn)
        .await
        .ok()?;
    Some(script_runs(&info))
}

/// `EVAL` and `EVALSHA` calls in an `INFO commandstats` answer.
fn script_runs(info: &str) -> u64 {
    info.lines()
        .filter_map(|l| {
            l.strip_prefix("cmdstat_evalsha:calls=")
                .or_else(|| l.strip_prefix("cmdstat_eval:calls="))
        })
        .filter_map(|rest| rest.split(',').next()?.parse::<u64>().ok())
        .sum()
}

async fn postgres_transactions(url: &str) -> Option<u64> {
    let mut conn = sqlx::PgConnection::connect(without_query(url)).await.ok()?;
    let n: i64 = sqlx::query_scalar(
        "SELECT (sum(xact_commit) + sum(xact_rollback))::bigint FROM pg_stat_database",
    )
    .fetch_one(&mut conn)
    .await
    .ok()?;
    u64::try_from(n).ok()
}

async fn mysql_questions(url: &str) -> Option<u64> {
    let url = without_query(url).replacen("mariadb://", "mysql://", 1);
    let mut conn = sqlx::MySqlConnection::connect(&url).await.ok()?;
    let (_, value): (String, String) = sqlx::query_as("SHOW GLOBAL STATUS LIKE 'Questions'")
        .fetch_one(&mut conn)
        .await
        .ok()?;
    value.parse().ok()
}

async fn etcd_messages(host: &str) -> Option<u64> {
    let text = exchange(
        host,
        format!("GET /metrics HTTP/1.0\r\nHost: {host}\r\n\r\n").as_bytes(),
    )
    .await?;
    let total: f64 = text
        .lines()
        .filter(|l| l.starts_with("grpc_server_msg_received_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum();
    Some(total as u64)
}

async fn zk_packets(host: &str) -> Option<u64> {
    let text = exchange(host, b"mntr").await?;
    text.lines()
        .find_map(|l| l.strip_prefix("zk_packets_received"))
        .and_then(|v| v.trim().parse().ok())
}

/// Send `request` to `host`, read until the server closes.
async fn exchange(host: &str, request: &[u8]) -> Option<String> {
    let mut stream = TcpStream::connect(host).await.ok()?;
    stream.write_all(request).await.ok()?;
    let mut out = Vec::new();
    stream.read_to_end(&mut out).await.ok()?;
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts_of_multi_host_urls() {
        assert_eq!(
            hosts("redlock://a:1,b:2/0?prefix=x"),
            vec!["a:1".to_string(), "b:2".to_string()]
        );
        assert_eq!(hosts("zk://u:p@h:2181/root"), vec!["h:2181".to_string()]);
        assert_eq!(hosts("etcd://h:2379"), vec!["h:2379".to_string()]);
    }

    #[test]
    fn script_runs_in_commandstats() {
        let info = "# Commandstats\r\ncmdstat_get:calls=900,usec=1\r\n\
                    cmdstat_evalsha:calls=40,usec=9,usec_per_call=0.2\r\n\
                    cmdstat_eval:calls=2,usec=1\r\n";
        assert_eq!(script_runs(info), 42);
        assert_eq!(script_runs("# Commandstats\r\n"), 0);
    }
}
