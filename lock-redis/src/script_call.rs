//! A script run built as one `EVALSHA` command, in place.
//!
//! `redis::ScriptInvocation` keeps each key and argument in a buffer of its
//! own and copies them all into a new command when it is sent: a dozen
//! allocations or so per run, on every acquire and release (ten runs per
//! cycle for Redlock on five nodes). [`ScriptCall`] writes the keys and
//! arguments straight into the command, sized up front.

use redis::aio::ConnectionLike;
use redis::{
    Cmd, ErrorKind, FromRedisValue, RedisError, RedisResult, Script, ServerErrorKind, ToRedisArgs,
};

/// Room made per argument still to come: an owner token (32 hex digits) or
/// a number fits.
const ARG_ROOM: usize = 40;

/// `EVALSHA`, the script's hash and the key count, with their lengths.
const HEAD_ROOM: usize = 64;

/// One run of a script: `EVALSHA hash numkeys KEYS… ARGV…`. If the server
/// does not know the script (`NOSCRIPT`: restarted, flushed, a new
/// replica), it is loaded and the command sent once more, as
/// `ScriptInvocation` does.
///
/// ```
/// use lock_redis::raw::{ACQUIRE, ScriptCall};
/// let mut call = ScriptCall::new(&ACQUIRE, &["lock", "fence", "queue", "handoff"], 4);
/// call.arg("owner").arg(30_000u64).arg("").arg(30_000u64);
/// ```
pub struct ScriptCall<'s> {
    script: &'s Script,
    cmd: Cmd,
    ack: Option<Acknowledge>,
}

/// Replicas that must acknowledge a script's writes (`WAIT`) before its
/// reply counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acknowledge {
    /// How many replicas.
    pub replicas: u8,
    /// How long to wait for them.
    pub timeout: std::time::Duration,
}

impl<'s> ScriptCall<'s> {
    /// A run of `script` with `keys` (its `KEYS`, in order), with room for
    /// `args` arguments to follow (a hint: more may be added).
    pub fn new(script: &'s Script, keys: &[&str], args: usize) -> Self {
        let key_bytes: usize = keys.iter().map(|k| k.len()).sum();
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + args,
            HEAD_ROOM + key_bytes + args * ARG_ROOM,
        );
        cmd.arg("EVALSHA").arg(script.get_hash()).arg(keys.len());
        for key in keys {
            cmd.arg(*key);
        }
        ScriptCall {
            script,
            cmd,
            ack: None,
        }
    }

    /// Have `ack`'s replicas acknowledge the run's writes: the script and
    /// a `WAIT` go out together, and a run that fewer replicas acknowledge
    /// in time fails as transient (`TRYAGAIN`), its writes left on the
    /// master for the caller to give back. `None` asks nobody.
    pub fn acknowledged(&mut self, ack: Option<Acknowledge>) -> &mut Self {
        self.ack = ack;
        self
    }

    /// The next argument (`ARGV[i]`, in the order added).
    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        self.cmd.arg(arg);
        self
    }

    /// Run the script on `conn`, loading it first if the server asks.
    pub async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut impl ConnectionLike,
    ) -> RedisResult<T> {
        let Some(ack) = self.ack else {
            return match self.cmd.query_async(conn).await {
                Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                    self.script.load_async(conn).await?;
                    self.cmd.query_async(conn).await
                }
                reply => reply,
            };
        };
        let mut pipe = redis::pipe();
        pipe.add_command(self.cmd.clone())
            .cmd("WAIT")
            .arg(ack.replicas)
            .arg(ack.timeout.as_millis() as u64);
        let (reply, acknowledged): (T, i64) = match pipe.query_async(conn).await {
            Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                self.script.load_async(conn).await?;
                pipe.query_async(conn).await?
            }
            reply => reply?,
        };
        if acknowledged < i64::from(ack.replicas) {
            return Err(RedisError::from((
                ErrorKind::Server(ServerErrorKind::TryAgain),
                "too few replicas acknowledged the write",
                format!(
                    "{acknowledged} of {} within {:?}",
                    ack.replicas, ack.timeout
                ),
            )));
        }
        Ok(reply)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The command sent is the one `ScriptInvocation` sends for the same
    /// keys and arguments.
    #[test]
    fn a_call_is_the_evalsha_command_of_its_keys_and_arguments() {
        let script = Script::new("return {KEYS[1], ARGV[1]}");
        let mut call = ScriptCall::new(&script, &["k1", "{name}:fence"], 3);
        call.arg("0123456789abcdef0123456789abcdef")
            .arg(u64::MAX)
            .arg("");
        let mut expected = redis::cmd("EVALSHA");
        expected
            .arg(script.get_hash())
            .arg(2)
            .arg("k1")
            .arg("{name}:fence")
            .arg("0123456789abcdef0123456789abcdef")
            .arg(u64::MAX)
            .arg("");
        assert_eq!(call.cmd.get_packed_command(), expected.get_packed_command());
        assert_eq!(call.cmd.args_iter().count(), 3 + 2 + 3);
    }
}
