//! `NatsLock`: the client, the bucket's stream, and the acquire path (one
//! conditional publish; waiters woken by releases, or when the holder's
//! TTL ends).

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use async_nats::jetstream::message::StreamMessage;
use async_nats::jetstream::stream::{LastRawMessageErrorKind, Stream};
use async_nats::{HeaderMap, jetstream};
use async_trait::async_trait;
use bytes::Bytes;
use futures_util::StreamExt;
use lock_core::raw::{
    Attempt, HolderRecord, Kind, Pace, RawLock, Request, WaitLoop, Watchdog, validate_name,
};
use lock_core::{
    Capabilities, CrashRelease, Fencing, Grade, LockError, LockGuard, LockInfo, LockOptions,
    RwLockCapabilities, RwLockInfo, SemaphoreCapabilities, SemaphoreInfo, Waiting,
};
use serde::Deserialize;
use tokio::time::Instant;

use crate::config::{NatsConfig, ParsedUrl, parse_url};
use crate::error::{
    BACKEND, api_error, duplicate_in_flight, map_publish, map_read, map_request, no_such_message,
    wrong_last_sequence,
};
use crate::grant::Claimed;
use crate::handle::Claim;
use crate::keys::{self, Subjects};
use crate::permits::MAX_LIMIT;
use crate::queue::{EXPIRY_SLACK, Line, Place};
use crate::stream;

/// The shortest per-message TTL the server takes: shorter leases ask the
/// server for this (the guard's validity still counts with its own TTL).
pub(crate) const MIN_SERVER_TTL: Duration = Duration::from_secs(1);

/// How many times one attempt writes again after finding a message that
/// was gone when read.
const LOOKS: usize = 3;

/// The line a request waits in, unless it asks for a plain lock.
fn line_of(req: &Request<'_>) -> Option<Line> {
    match req.kind() {
        Kind::Rw(access) => Some(Line::Rw(access)),
        Kind::Permit(limit) => Some(Line::Permit(limit)),
        Kind::Lock => None,
    }
}

/// What NATS locks prove. With a stream kept by 3 or more servers, a
/// grant is in the Raft log of a majority before it is answered: tokens
/// (stream sequences) never go back and a minority's loss keeps every
/// lock. On one server a grant is written to the server's files but not
/// flushed to the disk (JetStream's default `sync_interval`): a killed
/// server process keeps it, a machine that loses power may not.
fn capabilities(replicated: bool) -> Capabilities {
    let (grade, fencing) = match replicated {
        true => (Grade::Correctness, Fencing::Safe),
        false => (Grade::Efficiency, Fencing::WhileServerKeepsData),
    };
    Capabilities::new(BACKEND, grade)
        .with_fencing(fencing)
        .with_crash_release(CrashRelease::Ttl)
        .with_survives_server_failure(replicated)
        // Releases are announced on the lock's subject; a lapsed holder's
        // end is read from its message's TTL.
        .with_waiting(Waiting::Notified)
        .with_min_lease(MIN_SERVER_TTL)
        // The holder record is the message's payload.
        .with_holder(true)
        // A permit is a lock on one of the semaphore's slot subjects;
        // releases are announced on the semaphore's subject; waiters mark
        // themselves, and the first ones take the free slots.
        .with_semaphore(Some(
            SemaphoreCapabilities::new(MAX_LIMIT)
                .with_fair_queue(true)
                .with_waiting(Waiting::Notified),
        ))
        // Readers and the writer are messages on subjects of the name's;
        // waiters mark themselves.
        .with_rw_lock(Some(
            RwLockCapabilities::new()
                .with_writer_preference(true)
                .with_fair_queue(true)
                .with_waiting(Waiting::Notified),
        ))
}

/// The TTL a lease of `ttl` asks the server for.
pub(crate) fn server_ttl(ttl: Duration) -> Duration {
    ttl.max(MIN_SERVER_TTL)
}

/// A TTL as the `Nats-TTL` header carries it.
pub(crate) fn ttl_header(ttl: Duration) -> String {
    format!("{}ms", ttl.as_millis().max(1))
}

/// A `Nats-TTL` header's duration: `500ms`, `5s`, `1m`, or whole seconds.
fn parse_ttl(value: &str) -> Option<Duration> {
    let value = value.trim();
    let number = |digits: &str| digits.parse::<u64>().ok();
    if let Some(ms) = value.strip_suffix("ms") {
        number(ms).map(Duration::from_millis)
    } else if let Some(s) = value.strip_suffix('s') {
        number(s).map(Duration::from_secs)
    } else if let Some(m) = value.strip_suffix('m') {
        number(m).map(|m| Duration::from_secs(m * 60))
    } else if let Some(h) = value.strip_suffix('h') {
        number(h).map(|h| Duration::from_secs(h * 3600))
    } else {
        number(value).map(Duration::from_secs)
    }
}

pub(crate) fn header(
    m: &StreamMessage,
    name: impl async_nats::header::IntoHeaderName,
) -> Option<&str> {
    m.headers.get(name).map(|v| v.as_str())
}

/// The owner token of the acquisition that wrote `m`.
pub(crate) fn owner_of(m: &StreamMessage) -> Option<&str> {
    header(m, keys::OWNER)
}

/// The fencing token of the grant `m` belongs to: its own sequence, or
/// the grant's, which the messages renewing it carry.
pub(crate) fn token_of(m: &StreamMessage) -> u64 {
    header(m, keys::TOKEN)
        .and_then(|t| t.parse().ok())
        .unwrap_or(m.sequence)
}

/// How long the lease of `m` has left by the server's timestamp and this
/// machine's clock, at most its whole TTL.
pub(crate) fn lease_left(m: &StreamMessage) -> Option<Duration> {
    let ttl = header(m, async_nats::header::NATS_MESSAGE_TTL).and_then(parse_ttl)?;
    let written: SystemTime = m.time.into();
    let left = (written + ttl)
        .duration_since(SystemTime::now())
        .unwrap_or(Duration::ZERO);
    Some(left.min(ttl))
}

/// One message of a lock, to be written if the last message of its
/// subject (or of `filter`'s subjects) is `expected` (0: none).
pub(crate) struct Put<'a> {
    pub(crate) expected: u64,
    /// The subjects `expected` is checked against, where not the
    /// message's own (a semaphore's grant: all its slots).
    pub(crate) filter: Option<&'a str>,
    /// The limit of the semaphore a permit's messages belong to.
    pub(crate) limit: Option<u32>,
    /// The TTL asked of the server.
    pub(crate) ttl: Duration,
    /// The acquisition's owner token.
    pub(crate) owner: &'a str,
    /// The grant's token, on the messages that renew it; `None` for the
    /// grant's own.
    pub(crate) token: Option<u64>,
    /// The holder record.
    pub(crate) record: &'a [u8],
}

/// What a conditional write found.
pub(crate) enum Written {
    /// Written: the message's sequence.
    At(u64),
    /// Not written: the subject's last message has this sequence (0: it
    /// has none), where the server said.
    Found(Option<u64>),
    /// Not written: the same grant (its message id) is still on its way
    /// into a replicated stream.
    InFlight,
}

/// A JetStream API error in an answer.
#[derive(Deserialize)]
pub(crate) struct ApiError {
    #[serde(default)]
    pub(crate) err_code: u64,
    #[serde(default)]
    pub(crate) description: String,
}

/// The answer to a stream info request with a subject filter.
#[derive(Deserialize)]
struct InfoAnswer {
    state: Option<InfoState>,
    error: Option<ApiError>,
}

/// The part of a stream's state that names its subjects.
#[derive(Deserialize)]
struct InfoState {
    /// Each subject under the filter that has messages, with their number.
    #[serde(default)]
    subjects: Option<HashMap<String, u64>>,
}

/// The answer to a message delete.
#[derive(Deserialize)]
struct DeleteAnswer {
    #[serde(default)]
    success: bool,
    error: Option<ApiError>,
}

/// Locks on NATS JetStream (nats-server 2.11 or later).
///
/// - **Bucket**: every lock is a subject of one stream, `KV_BUCKET`
///   (`$KV.BUCKET.lock.NAME`), made on first use with one message per
///   subject and per-message TTLs. It reads as a NATS key-value bucket
///   (`nats kv get BUCKET lock.NAME`).
/// - **Acquire** is one publish of the holder record, with the lease as
///   the message's TTL, on the condition that the subject has no message
///   (`Nats-Expected-Last-Subject-Sequence: 0`). The message's stream
///   sequence is the **fencing token**: it only grows, across every name.
/// - **Renewal** publishes the message again on the condition that ours is
///   still the subject's last, with a new TTL; **release** deletes our
///   message by its sequence and announces it on
///   `distlock.BUCKET.released.NAME` (core NATS). A crashed holder's
///   message expires with its TTL.
/// - **Waiters** listen for releases and otherwise sleep until the
///   holder's TTL ends; they are not queued (no fair order).
/// - **Semaphores** ([`Semaphore`](lock_core::Semaphore)): a permit is a
///   message on one of the name's slot subjects, published on the
///   condition that none of the semaphore's subjects changed since they
///   were read. **Reader-writer locks** ([`RwLockExt`](lock_core::RwLockExt),
///   writers first): a message per reader and for the writer, each
///   published on the condition that none of the lock's subjects changed
///   since they were read; a write's token is recorded for the readers
///   after it.
///
/// ```no_run
/// # async fn demo() -> Result<(), lock_core::LockError> {
/// use lock_core::{DistributedLock, LockOptions};
/// let locks = lock_nats::NatsLock::connect("nats://10.0.0.1:4222,10.0.0.2:4222/myapp?replicas=3").await?;
/// let guard = locks.acquire("nightly-report", &LockOptions::new()).await?;
/// let token = guard.fencing_token(); // the grant's stream sequence
/// guard.release().await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct NatsLock {
    pub(crate) inner: Arc<Inner>,
    pub(crate) watchdog: Watchdog,
}

pub(crate) struct Inner {
    client: async_nats::Client,
    js: jetstream::Context,
    stream: Stream,
    config: NatsConfig,
    display: String,
    pub(crate) caps: Capabilities,
    /// The URL the lock was built from (none on the application's own
    /// client): a release at shutdown connects with it again.
    url: Option<Arc<ParsedUrl>>,
}

impl fmt::Debug for NatsLock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NatsLock")
            .field("servers", &self.inner.display)
            .field("config", &self.inner.config)
            .finish()
    }
}

impl NatsLock {
    /// Connect to `nats://[user:pass@|token@]host[:port][,host[:port]…][/bucket]`
    /// (or `nats+tls://` for TLS, with `tls_ca=PATH` to trust a CA of your
    /// own) with options `replicas` (of the bucket's stream, when this
    /// client makes it), `connect_timeout` and `request_timeout`
    /// (durations with their unit, `2s`, `500ms`), and `discover=false`
    /// to connect only to the servers the URL names, never to the others
    /// they advertise (a cluster reached through addresses of its own).
    pub async fn connect(url: &str) -> Result<Self, LockError> {
        let parsed = parse_url(url)?;
        let client = parsed.connect().await?;
        let (config, display) = (parsed.config.clone(), parsed.display.clone());
        Ok(Self::on(
            Inner::open(client, config, display, Some(Arc::new(parsed))).await?,
        ))
    }

    /// A lock on a NATS client the application already has (its own
    /// servers, credentials and TLS set-up), with `config` in place of a
    /// URL's options: `NatsLock::with_client(client, NatsConfig::default())`.
    /// Give the client a request timeout
    /// (`ConnectOptions::request_timeout`): the lock's JetStream requests
    /// are bounded by `config.request_timeout`.
    pub async fn with_client(
        client: async_nats::Client,
        config: NatsConfig,
    ) -> Result<Self, LockError> {
        config.validate()?;
        let display = format!("the application's NATS client, bucket {}", config.bucket);
        Ok(Self::on(Inner::open(client, config, display, None).await?))
    }

    fn on(inner: Inner) -> Self {
        NatsLock {
            inner: Arc::new(inner),
            watchdog: Watchdog::new(),
        }
    }

    /// The settings in use.
    pub fn config(&self) -> &NatsConfig {
        &self.inner.config
    }

    /// One attempt at what `req` asks for (a lock, a permit, access),
    /// without waiting: a permit or access does not pass a waiter's mark.
    async fn attempt_any(&self, req: Request<'_>) -> Result<Attempt, LockError> {
        match line_of(&req) {
            Some(line) => Ok(self.attempt_in_line(req, line, Place::New).await?.0),
            None => self.attempt(req.name, req.opts).await,
        }
    }

    /// One attempt at `name`, without waiting: a publish on the condition
    /// that the lock's subject has no message.
    async fn attempt(&self, name: &str, opts: &LockOptions) -> Result<Attempt, LockError> {
        let subjects = Subjects::of(&self.inner.config.bucket, name);
        for _ in 0..LOOKS {
            let last = match self
                .claim(subjects.clone(), opts, Claim::default(), "acquiring a lock")
                .await?
            {
                Claimed::Stored(seq, stored) => {
                    return self.hand_out(name, opts, seq, stored, |g| g).await;
                }
                Claimed::Refused(last) => last,
            };
            // Held, unless the holder's message went between the write and
            // this read (released, expired): then write again.
            if let Some(m) = self
                .inner
                .found(&subjects, last, "reading a lock's holder")
                .await?
            {
                return Ok(Attempt::Held {
                    expires_in: lease_left(&m),
                });
            }
        }
        Ok(Attempt::Held { expires_in: None })
    }
}

impl Inner {
    /// The lock's state on `client` (a server of 2.11 or later), its
    /// bucket's stream opened (made if missing).
    async fn open(
        client: async_nats::Client,
        config: NatsConfig,
        display: String,
        url: Option<Arc<ParsedUrl>>,
    ) -> Result<Self, LockError> {
        stream::check_server_version(&client.server_info().version)?;
        let mut js = jetstream::new(client.clone());
        js.set_timeout(config.request_timeout);
        let (stream, replicas) = stream::open(&js, &config, &display).await?;
        Ok(Inner {
            client,
            js,
            stream,
            config,
            display,
            caps: capabilities(replicas >= 3),
            url,
        })
    }

    /// The same lock on a client of its own, connected again from the URL
    /// when the returned future runs (on whatever runtime runs it): for a
    /// release at shutdown. `None` for a lock on the application's own
    /// client, which has no URL.
    pub(crate) fn reconnect(
        &self,
    ) -> Option<impl Future<Output = Result<Inner, LockError>> + Send + 'static> {
        let url = Arc::clone(self.url.as_ref()?);
        let (config, display) = (self.config.clone(), self.display.clone());
        Some(async move { Inner::open(url.connect().await?, config, display, None).await })
    }

    /// The settings in use.
    pub(crate) fn config(&self) -> &NatsConfig {
        &self.config
    }

    /// Listen for the releases announced on `subject`: subscribed, and
    /// the subscription flushed to the server, so that none announced
    /// after this returns is missed.
    pub(crate) async fn listen(
        &self,
        subject: String,
    ) -> Result<async_nats::Subscriber, LockError> {
        let doing = "listening for releases";
        let released = self
            .client
            .subscribe(subject)
            .await
            .map_err(|e| LockError::unavailable(BACKEND, doing.to_string(), e))?;
        self.client
            .flush()
            .await
            .map_err(|e| LockError::unavailable(BACKEND, doing.to_string(), e))?;
        Ok(released)
    }

    /// Publish `put` to the lock's subject on its condition.
    pub(crate) async fn write(
        &self,
        subjects: &Subjects,
        put: &Put<'_>,
        doing: &str,
    ) -> Result<Written, LockError> {
        let mut headers = HeaderMap::new();
        headers.insert(
            async_nats::header::NATS_EXPECTED_LAST_SUBJECT_SEQUENCE,
            put.expected.to_string().as_str(),
        );
        headers.insert(
            async_nats::header::NATS_MESSAGE_TTL,
            ttl_header(put.ttl).as_str(),
        );
        if let Some(filter) = put.filter {
            headers.insert(keys::EXPECTED_SUBJECTS, filter);
        }
        if let Some(limit) = put.limit {
            headers.insert(keys::LIMIT, limit.to_string().as_str());
        }
        headers.insert(keys::OWNER, put.owner);
        match put.token {
            Some(token) => headers.insert(keys::TOKEN, token.to_string().as_str()),
            // A grant's publish carries its owner as its message id: the
            // same publish sent again (to clean up after an attempt whose
            // answer never came) is answered with the first one's sequence
            // if that was stored, within the stream's duplicate window.
            None => headers.insert(async_nats::header::NATS_MESSAGE_ID, put.owner),
        }
        self.publish(
            subjects.lock.clone(),
            headers,
            Bytes::copy_from_slice(put.record),
            doing,
        )
        .await
    }

    /// Publish `payload` with `headers` (their conditions, if any) to the
    /// stream's `subject`.
    pub(crate) async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        doing: &str,
    ) -> Result<Written, LockError> {
        let acked = match self
            .js
            .publish_with_headers(subject, headers, payload)
            .await
        {
            Ok(ack) => ack.await,
            Err(e) => Err(e),
        };
        match acked {
            Ok(ack) => Ok(Written::At(ack.sequence)),
            Err(e) if duplicate_in_flight(&e) => Ok(Written::InFlight),
            Err(e) => match wrong_last_sequence(&e) {
                Some(last) => Ok(Written::Found(last)),
                None => Err(map_publish(doing, e)),
            },
        }
    }

    /// The subject's last message, if it has one.
    pub(crate) async fn last(
        &self,
        subjects: &Subjects,
        doing: &str,
    ) -> Result<Option<StreamMessage>, LockError> {
        self.last_on(&subjects.lock, doing).await
    }

    /// The last message of `subject`, or of all the subjects a wildcard
    /// `subject` matches, if there is one.
    pub(crate) async fn last_on(
        &self,
        subject: &str,
        doing: &str,
    ) -> Result<Option<StreamMessage>, LockError> {
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(e) => Err(map_read(doing, e)),
        }
    }

    /// The subjects under `filter` that have a message, in one stream
    /// info request.
    pub(crate) async fn subjects_with_messages(
        &self,
        filter: &str,
        doing: &str,
    ) -> Result<Vec<String>, LockError> {
        let subject = format!("STREAM.INFO.{}", keys::stream_name(&self.config.bucket));
        let answer: InfoAnswer = self
            .js
            .request(subject, &serde_json::json!({ "subjects_filter": filter }))
            .await
            .map_err(|e| map_request(doing, e))?;
        if let Some(e) = answer.error {
            return Err(api_error(doing, e.err_code, &e.description));
        }
        let subjects = answer.state.and_then(|s| s.subjects).unwrap_or_default();
        Ok(subjects
            .into_iter()
            .filter(|&(_, messages)| messages > 0)
            .map(|(subject, _)| subject)
            .collect())
    }

    /// The message a refused write found: the one of the sequence the
    /// server named, or, where it named none, the subject's last.
    pub(crate) async fn found(
        &self,
        subjects: &Subjects,
        last: Option<u64>,
        doing: &str,
    ) -> Result<Option<StreamMessage>, LockError> {
        match last {
            Some(seq) => self.message(seq, doing).await,
            None => self.last(subjects, doing).await,
        }
    }

    /// The stream's message `seq`, if it is still there.
    pub(crate) async fn message(
        &self,
        seq: u64,
        doing: &str,
    ) -> Result<Option<StreamMessage>, LockError> {
        match self.stream.get_raw_message(seq).await {
            Ok(m) => Ok(Some(m)),
            Err(e) if matches!(e.kind(), LastRawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(e) => Err(map_read(doing, e)),
        }
    }

    /// Delete the stream's message `seq`: `false` if there was none.
    pub(crate) async fn delete(&self, seq: u64, doing: &str) -> Result<bool, LockError> {
        let subject = format!(
            "STREAM.MSG.DELETE.{}",
            keys::stream_name(&self.config.bucket)
        );
        let answer: DeleteAnswer = self
            .js
            .request(
                subject,
                &serde_json::json!({ "seq": seq, "no_erase": true }),
            )
            .await
            .map_err(|e| map_request(doing, e))?;
        match answer.error {
            None => Ok(answer.success),
            Some(e) if no_such_message(e.err_code, &e.description) => Ok(false),
            Some(e) => Err(api_error(doing, e.err_code, &e.description)),
        }
    }

    /// Tell the waiters listening on `subject` that what they wait for was
    /// released, flushed to the server before this returns: a client
    /// dropped right after a release (a process that exits) would
    /// otherwise lose it from its buffer. A lost announcement costs a
    /// waiter its wake-up, not the lock: it tries again when the holder's
    /// TTL would have ended.
    pub(crate) async fn announce_release(&self, subject: &str) {
        let sent = match self.client.publish(subject.to_string(), Bytes::new()).await {
            Ok(()) => self.client.flush().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(error) = sent {
            tracing::debug!(target: "distlock", backend = BACKEND, %error, "a release could not be announced to its waiters");
        }
    }
}

#[async_trait]
impl RawLock for NatsLock {
    fn raw_capabilities(&self) -> Capabilities {
        self.inner.caps
    }

    async fn attempt_once(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        self.attempt_any(req).await?.into_guard()
    }

    /// Listens for the name's releases (subscribed before the first
    /// attempt, so none is missed), and otherwise sleeps until the
    /// holder's TTL ends by its message's timestamp. Permits and
    /// reader-writer access wait in line ([`crate::queue`]).
    async fn wait(&self, req: Request<'_>) -> Result<Option<LockGuard>, LockError> {
        if let Some(line) = line_of(&req) {
            return self.wait_in_line(req, line).await;
        }
        let subject = Subjects::of(&self.inner.config.bucket, req.name).released;
        let mut released = self.inner.listen(subject).await?;
        let mut listening = true;
        let mut wait = WaitLoop::new(req, None);
        loop {
            let mut too_late = None;
            let pace = match self.attempt(req.name, req.opts).await? {
                Attempt::Acquired(guard) => return Ok(Some(guard)),
                Attempt::Held {
                    expires_in: Some(left),
                } => Pace::Until(Instant::now() + left + EXPIRY_SLACK),
                Attempt::Held { expires_in: None } => Pace::Backoff { holder_left: None },
                Attempt::TooLate(e) => {
                    too_late = Some(e);
                    Pace::For(Duration::ZERO)
                }
            };
            tokio::select! {
                go_on = wait.pause(pace) => {
                    if !go_on {
                        return too_late.map_or(Ok(None), Err);
                    }
                }
                message = released.next(), if listening => {
                    // The subscription ended (the client closed): the
                    // holders' TTLs still pace the wait.
                    listening = message.is_some();
                }
            }
        }
    }

    /// The lock's subjects with a message, then each holder's message.
    async fn raw_inspect_rw(&self, name: &str) -> Result<RwLockInfo, LockError> {
        self.inspect_rw_lock(name).await
    }

    /// The semaphore's slots with a message, then each permit's message.
    async fn raw_inspect_semaphore(&self, name: &str) -> Result<SemaphoreInfo, LockError> {
        self.inspect_permits(name).await
    }

    /// One read of the lock's message: its token, its lease left and its
    /// holder record. Waiters are not queued on the server, so their
    /// number is not known.
    async fn raw_inspect(&self, name: &str) -> Result<LockInfo, LockError> {
        validate_name(name)?;
        let subjects = Subjects::of(&self.inner.config.bucket, name);
        let Some(m) = self.inner.last(&subjects, "reading a lock's state").await? else {
            return Ok(LockInfo::free());
        };
        let holder = HolderRecord::decode(&m.payload).map_err(|reason| LockError::Backend {
            backend: BACKEND,
            reason: format!("reading a lock's holder: {reason}"),
            source: None,
        })?;
        Ok(LockInfo::held()
            .with_fencing_token(Some(token_of(&m)))
            .with_expires_in(lease_left(&m))
            .with_holder(Some(holder)))
    }

    /// Deletes the lock's message, whoever wrote it, and announces the
    /// release to its waiters.
    async fn raw_force_release(&self, name: &str) -> Result<bool, LockError> {
        validate_name(name)?;
        let subjects = Subjects::of(&self.inner.config.bucket, name);
        let doing = "releasing a lock by force";
        for _ in 0..LOOKS {
            let Some(m) = self.inner.last(&subjects, doing).await? else {
                return Ok(false);
            };
            if self.inner.delete(m.sequence, doing).await? {
                self.inner.announce_release(&subjects.released).await;
                return Ok(true);
            }
        }
        Ok(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ttl_headers_read_back() {
        for ttl in [
            Duration::from_secs(1),
            Duration::from_millis(1500),
            Duration::from_secs(86_400),
        ] {
            assert_eq!(parse_ttl(&ttl_header(ttl)), Some(ttl));
        }
        assert_eq!(parse_ttl("5"), Some(Duration::from_secs(5)));
        assert_eq!(parse_ttl("2m"), Some(Duration::from_secs(120)));
        assert_eq!(parse_ttl("never"), None);
        assert_eq!(server_ttl(Duration::from_millis(300)), MIN_SERVER_TTL);
    }

    #[test]
    fn only_a_replicated_stream_is_correctness_grade() {
        assert_eq!(capabilities(true).grade, Grade::Correctness);
        assert_eq!(capabilities(true).fencing, Fencing::Safe);
        assert_eq!(capabilities(false).grade, Grade::Efficiency);
        assert!(!capabilities(false).survives_server_failure);
    }
}
