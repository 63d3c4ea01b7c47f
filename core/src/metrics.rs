//! The process's metrics, in one registry: what `/metrics` on the diagnostics listener shows
//! (`sallyport_*`, Prometheus text format). Every service of the process (auth, proxy, agents)
//! counts into [`metrics()`]; nothing here listens or decides anything.
//!
//! Architecture invariant: a label value is one of the closed vocabularies below (a door, a
//! route *pattern* of [`crate::routes::AUTH`], a reason class, a queue, a certificate) — never
//! a user, node, address, concrete path or any other string from outside. Each family then
//! has a fixed, small number of series, whatever the traffic.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::{LazyLock, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::routes::{Method, Route};

/// A closed vocabulary used as a label value: an enum and the word each variant is on the wire.
macro_rules! label_values {
    ($(#[$doc:meta])* $name:ident {
        $($(#[$vdoc:meta])* $variant:ident => $word:literal),+ $(,)?
    }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum $name { $($(#[$vdoc])* $variant),+ }

        impl $name {
            pub const ALL: &[$name] = &[$($name::$variant),+];

            pub fn as_str(self) -> &'static str {
                match self { $($name::$variant => $word),+ }
            }
        }

        impl EncodeLabelValue for $name {
            fn encode(&self, e: &mut LabelValueEncoder<'_>) -> std::fmt::Result {
                e.write_str(self.as_str())
            }
        }
    };
}

label_values! {
    /// What an agent's tunnel serves.
    TunnelKind { Node => "node", Kube => "kube" }
}

label_values! {
    /// The door a session came through.
    SessionDoor { Ssh => "ssh", Web => "web", Kube => "kube" }
}

label_values! {
    /// Why a session was refused, by kind (the proxy's `session::Refusal` variants).
    RejectReason {
        Offline => "offline",
        Denied => "denied",
        HostKey => "host_key",
        Locked => "locked",
        Expired => "expired",
        Limit => "limit",
        Failed => "failed",
    }
}

label_values! {
    /// How a request to auth ended: the class of its status, or no answer at all.
    StatusClass {
        Success => "2xx",
        Redirect => "3xx",
        ClientError => "4xx",
        ServerError => "5xx",
        NoAnswer => "error",
    }
}

label_values! {
    /// A queue audit records wait in before they are written.
    AuditQueue {
        /// The proxy's failed authentications on their way to auth (`failed_auth`).
        ProxyFailedAuth => "proxy_failed_auth",
        /// Sessions' events and ends on their way to auth (every session's queue together).
        ProxySessionEvents => "proxy_session_events",
        /// `kube.request` records on their way to auth.
        ProxyKubeRequests => "proxy_kube_requests",
        /// Records waiting for auth's audit chain (its append lock), being written included.
        AuthAuditWriter => "auth_audit_writer",
    }
}

label_values! {
    /// A certificate this process holds.
    CertificateKind {
        AuthTls => "auth_tls",
        ProxyTls => "proxy_tls",
        ProxySshHost => "proxy_ssh_host",
        AgentTls => "agent_tls",
        AgentSshHost => "agent_ssh_host",
        KubeAgentTls => "kube_agent_tls",
    }
}

label_values! {
    /// A request's method: those the APIs use, and one word for any other.
    HttpMethod { Get => "GET", Post => "POST", Put => "PUT", Delete => "DELETE", Other => "other" }
}

impl HttpMethod {
    pub fn parse(method: &str) -> Self {
        match method {
            "GET" => HttpMethod::Get,
            "POST" => HttpMethod::Post,
            "PUT" => HttpMethod::Put,
            "DELETE" => HttpMethod::Delete,
            _ => HttpMethod::Other,
        }
    }

    fn route_method(self) -> Option<Method> {
        match self {
            HttpMethod::Get => Some(Method::Get),
            HttpMethod::Post => Some(Method::Post),
            HttpMethod::Put => Some(Method::Put),
            HttpMethod::Delete => Some(Method::Delete),
            HttpMethod::Other => None,
        }
    }
}

impl StatusClass {
    pub fn of(status: u16) -> Self {
        match status {
            200..=299 => StatusClass::Success,
            300..=399 => StatusClass::Redirect,
            400..=499 => StatusClass::ClientError,
            _ => StatusClass::ServerError,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct TunnelLabels {
    kind: TunnelKind,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct DoorLabels {
    door: SessionDoor,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RejectLabels {
    door: SessionDoor,
    reason: RejectReason,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct RouteLabels {
    method: HttpMethod,
    /// A pattern of [`crate::routes::AUTH`], or [`UNMATCHED`].
    route: &'static str,
    status: StatusClass,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct QueueLabels {
    queue: AuditQueue,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash, EncodeLabelSet)]
struct CertificateLabels {
    certificate: CertificateKind,
}

/// The route label of a request that matched no route of the list.
pub const UNMATCHED: &str = "unmatched";

/// Latency buckets for requests to auth (seconds): a local `SELECT` answers in well under a
/// millisecond, a password check takes a quarter of a second, a cold TLS connection tens of
/// milliseconds; the client gives up at 30 s.
const LATENCY_BUCKETS: [f64; 15] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(LATENCY_BUCKETS)
}

type Latencies = Family<RouteLabels, Histogram, fn() -> Histogram>;

/// Every metric of the process. Reached through [`metrics()`].
pub struct Metrics {
    registry: Registry,
    tunnels_connected: Family<TunnelLabels, Gauge>,
    agent_tunnel_up: Family<TunnelLabels, Gauge>,
    sessions_active: Family<DoorLabels, Gauge>,
    sessions_started: Family<DoorLabels, Counter>,
    sessions_rejected: Family<RejectLabels, Counter>,
    auth_client_latency: Latencies,
    auth_latency: Latencies,
    audit_queue_depth: Family<QueueLabels, Gauge>,
    audit_dropped: Family<QueueLabels, Counter>,
    recording_written: Counter,
    upload_backlog_files: Gauge,
    upload_backlog_bytes: Gauge,
    certificate_expiry: Family<CertificateLabels, Gauge>,
    /// Each certificate's `not_after` (Unix seconds); the gauge is the time left at each scrape.
    not_after: Mutex<BTreeMap<CertificateKind, i64>>,
}

static METRICS: LazyLock<Metrics> = LazyLock::new(Metrics::new);

/// The process's metrics.
pub fn metrics() -> &'static Metrics {
    &METRICS
}

/// `Content-Type` of [`encode`]'s text.
pub const CONTENT_TYPE: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;

/// Every metric, in the Prometheus text format (0.0.4).
pub fn encode() -> String {
    let m = metrics();
    m.refresh_certificates();
    let mut out = String::new();
    // Writing into a String cannot fail.
    let _ = prometheus_client::encoding::prometheus_text::encode(&mut out, &m.registry);
    out
}

impl Metrics {
    fn new() -> Self {
        let m = Metrics {
            registry: Registry::default(),
            tunnels_connected: Family::default(),
            agent_tunnel_up: Family::default(),
            sessions_active: Family::default(),
            sessions_started: Family::default(),
            sessions_rejected: Family::default(),
            auth_client_latency: Family::new_with_constructor(latency_histogram),
            auth_latency: Family::new_with_constructor(latency_histogram),
            audit_queue_depth: Family::default(),
            audit_dropped: Family::default(),
            recording_written: Counter::default(),
            upload_backlog_files: Gauge::default(),
            upload_backlog_bytes: Gauge::default(),
            certificate_expiry: Family::default(),
            not_after: Mutex::new(BTreeMap::new()),
        };
        // Series that exist from the start read 0 rather than missing: a dashboard or an
        // alert on them needs no `absent()`.
        for &kind in TunnelKind::ALL {
            m.tunnels_connected
                .get_or_create(&TunnelLabels { kind })
                .set(0);
        }
        for &door in SessionDoor::ALL {
            m.sessions_active.get_or_create(&DoorLabels { door }).set(0);
            m.sessions_started
                .get_or_create(&DoorLabels { door })
                .inc_by(0);
        }
        for &queue in AuditQueue::ALL {
            m.audit_queue_depth
                .get_or_create(&QueueLabels { queue })
                .set(0);
        }
        let mut r = Registry::default();
        r.register(
            "sallyport_tunnels_connected",
            "Agent tunnels connected to this proxy, by what the agent serves",
            m.tunnels_connected.clone(),
        );
        r.register(
            "sallyport_agent_tunnel_up",
            "1 while this process's agent holds its tunnel to the proxy, 0 while it reconnects",
            m.agent_tunnel_up.clone(),
        );
        r.register(
            "sallyport_sessions_active",
            "Sessions running through this proxy, by door",
            m.sessions_active.clone(),
        );
        r.register(
            "sallyport_sessions_started",
            "Sessions started through this proxy, by door",
            m.sessions_started.clone(),
        );
        r.register(
            "sallyport_sessions_rejected",
            "Sessions refused by this proxy, by door and kind of refusal",
            m.sessions_rejected.clone(),
        );
        r.register(
            "sallyport_auth_client_request_duration_seconds",
            "Requests this proxy made to auth, to the answer's headers, by route pattern",
            m.auth_client_latency.clone(),
        );
        r.register(
            "sallyport_auth_request_duration_seconds",
            "Requests auth answered, to the answer's headers, by route pattern",
            m.auth_latency.clone(),
        );
        r.register(
            "sallyport_audit_queue_depth",
            "Audit records waiting to be sent to auth or written, by queue",
            m.audit_queue_depth.clone(),
        );
        r.register(
            "sallyport_audit_queue_dropped",
            "Audit reports a full queue dropped (counted and reported to auth instead), by queue",
            m.audit_dropped.clone(),
        );
        r.register(
            "sallyport_recording_written_bytes",
            "Bytes written to session recordings",
            m.recording_written.clone(),
        );
        r.register(
            "sallyport_recording_upload_backlog_files",
            "Finished recordings not yet uploaded to the recording store",
            m.upload_backlog_files.clone(),
        );
        r.register(
            "sallyport_recording_upload_backlog_bytes",
            "Bytes of finished recordings not yet uploaded to the recording store",
            m.upload_backlog_bytes.clone(),
        );
        r.register(
            "sallyport_certificate_expiry_seconds",
            "Seconds until each certificate this process holds expires (negative: expired)",
            m.certificate_expiry.clone(),
        );
        Metrics { registry: r, ..m }
    }

    /// An agent's tunnel was registered (`kind`), replacing the tunnel of `replaced` if any.
    pub fn tunnel_connected(&self, kind: TunnelKind, replaced: Option<TunnelKind>) {
        if let Some(old) = replaced {
            self.tunnels_connected
                .get_or_create(&TunnelLabels { kind: old })
                .dec();
        }
        self.tunnels_connected
            .get_or_create(&TunnelLabels { kind })
            .inc();
    }

    /// A registered tunnel went away.
    pub fn tunnel_disconnected(&self, kind: TunnelKind) {
        self.tunnels_connected
            .get_or_create(&TunnelLabels { kind })
            .dec();
    }

    /// One more (`up`) or one fewer of this process's agent tunnels of `kind`: an agent keeps
    /// one to each proxy.
    pub fn agent_tunnel(&self, kind: TunnelKind, up: bool) {
        let g = self.agent_tunnel_up.get_or_create(&TunnelLabels { kind });
        if up {
            g.inc();
        } else {
            g.dec();
        }
    }

    /// This process runs an agent of `kind`: its series exists (at 0) before any tunnel is up.
    pub fn agent_runs(&self, kind: TunnelKind) {
        let _ = self.agent_tunnel_up.get_or_create(&TunnelLabels { kind });
    }

    /// Whether this process's agent of `kind` holds its tunnel now (`None`: no such agent).
    pub fn agent_tunnel_is_up(&self, kind: TunnelKind) -> Option<bool> {
        // Read without creating the series: a process without that agent has none.
        self.agent_tunnel_up
            .get(&TunnelLabels { kind })
            .map(|g| g.get() >= 1)
    }

    /// A session started at `door`: counted, and active until the guard is dropped.
    pub fn session_started(&'static self, door: SessionDoor) -> ActiveSession {
        let labels = DoorLabels { door };
        self.sessions_started.get_or_create(&labels).inc();
        self.sessions_active.get_or_create(&labels).inc();
        ActiveSession {
            metrics: self,
            door,
        }
    }

    /// A session was refused at `door`.
    pub fn session_rejected(&self, door: SessionDoor, reason: RejectReason) {
        self.sessions_rejected
            .get_or_create(&RejectLabels { door, reason })
            .inc();
    }

    /// A request the proxy made to auth, as `route` (a pattern of [`crate::routes::AUTH`],
    /// else [`UNMATCHED`]).
    pub fn auth_client_request(&self, route: RouteLabel, status: StatusClass, took: Duration) {
        observe(&self.auth_client_latency, route, status, took);
    }

    /// A request auth answered.
    pub fn auth_request(&self, route: RouteLabel, status: StatusClass, took: Duration) {
        observe(&self.auth_latency, route, status, took);
    }

    /// `n` records entered `queue`.
    pub fn audit_queued(&self, queue: AuditQueue, n: usize) {
        self.audit_queue_depth
            .get_or_create(&QueueLabels { queue })
            .inc_by(n as i64);
    }

    /// `n` records left `queue` (sent, written or given up).
    pub fn audit_dequeued(&self, queue: AuditQueue, n: usize) {
        self.audit_queue_depth
            .get_or_create(&QueueLabels { queue })
            .dec_by(n as i64);
    }

    /// A full `queue` dropped a report.
    pub fn audit_dropped(&self, queue: AuditQueue) {
        self.audit_dropped
            .get_or_create(&QueueLabels { queue })
            .inc();
    }

    /// `n` bytes were written to a recording.
    pub fn recording_written(&self, n: u64) {
        self.recording_written.inc_by(n);
    }

    /// What waits to be uploaded to the recording store: the uploader sets it as its backlog
    /// changes.
    pub fn set_recording_upload_backlog(&self, files: u64, bytes: u64) {
        self.upload_backlog_files
            .set(i64::try_from(files).unwrap_or(i64::MAX));
        self.upload_backlog_bytes
            .set(i64::try_from(bytes).unwrap_or(i64::MAX));
    }

    /// This process holds `cert` until `not_after` (Unix seconds); called again on renewal.
    pub fn certificate_expires(&self, cert: CertificateKind, not_after: i64) {
        if let Ok(mut m) = self.not_after.lock() {
            m.insert(cert, not_after);
        }
        self.refresh_certificates();
    }

    /// The time left on each certificate, now.
    fn refresh_certificates(&self) {
        let now = crate::unix_now();
        let Ok(m) = self.not_after.lock() else { return };
        for (&certificate, &not_after) in m.iter() {
            self.certificate_expiry
                .get_or_create(&CertificateLabels { certificate })
                .set(not_after.saturating_sub(now));
        }
    }
}

fn observe(family: &Latencies, route: RouteLabel, status: StatusClass, took: Duration) {
    family
        .get_or_create(&RouteLabels {
            method: route.method,
            route: route.pattern,
            status,
        })
        .observe(took.as_secs_f64());
}

/// A route as a label: a method and a pattern from a route list, never a concrete path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouteLabel {
    method: HttpMethod,
    pattern: &'static str,
}

impl RouteLabel {
    /// The route of `list` that `path` (a concrete path, query allowed) takes under `method`
    /// (`GET`, ...): its pattern, or [`UNMATCHED`] — so a name in a path never becomes a label
    /// value.
    pub fn of(list: &[Route], method: &str, path: &str) -> Self {
        let method = HttpMethod::parse(method);
        let pattern = method
            .route_method()
            .and_then(|m| crate::routes::pattern_of(list, m, path));
        RouteLabel {
            method,
            pattern: pattern.unwrap_or(UNMATCHED),
        }
    }
}

/// A running session, counted in `sallyport_sessions_active` until dropped.
pub struct ActiveSession {
    metrics: &'static Metrics,
    door: SessionDoor,
}

impl Drop for ActiveSession {
    fn drop(&mut self) {
        self.metrics
            .sessions_active
            .get_or_create(&DoorLabels { door: self.door })
            .dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::routes::AUTH;

    /// The value of the series `name{labels}` in `text` (NaN, which no comparison takes, when
    /// it is not there).
    fn value(text: &str, series: &str) -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or(f64::NAN)
    }

    #[test]
    fn routes_are_labelled_by_pattern_never_by_the_concrete_path() {
        for (method, path, want) in [
            (
                "POST",
                "/v1/nodes/web%201/presence",
                "/v1/nodes/{name}/presence",
            ),
            ("GET", "/v1/sessions/abc", "/v1/sessions/{id}"),
            ("GET", "/v1/audit?type=x&user=alice", "/v1/audit"),
            ("POST", "/v1/sessions", "/v1/sessions"),
            // A method the pattern does not answer, a path no route has, one segment too many,
            // an empty parameter, a method no route has.
            ("DELETE", "/v1/sessions/abc", UNMATCHED),
            ("GET", "/v1/alice", UNMATCHED),
            ("GET", "/v1/sessions/a/b/c", UNMATCHED),
            ("GET", "/v1/sessions/", UNMATCHED),
            ("PATCH", "/v1/sessions", UNMATCHED),
        ] {
            assert_eq!(RouteLabel::of(AUTH, method, path).pattern, want, "{path}");
        }
    }

    #[test]
    fn the_text_names_units_and_every_line_is_a_comment_or_a_sample() {
        let m = metrics();
        let guard = m.session_started(SessionDoor::Web);
        m.session_rejected(SessionDoor::Ssh, RejectReason::Denied);
        m.auth_request(
            RouteLabel::of(AUTH, "GET", "/v1/users/bob"),
            StatusClass::of(404),
            Duration::from_millis(3),
        );
        m.certificate_expires(CertificateKind::AuthTls, crate::unix_now() + 3600);
        m.recording_written(10);
        let text = encode();
        for line in text.lines() {
            let sample = line
                .rsplit_once(' ')
                .is_some_and(|(_, v)| v.parse::<f64>().is_ok());
            assert!(line.starts_with('#') || sample, "{line}");
            assert!(
                line.starts_with("# ") || line.starts_with("sallyport_"),
                "{line}"
            );
        }
        assert!(value(&text, "sallyport_sessions_active{door=\"web\"}") >= 1.0);
        assert!(
            value(
                &text,
                "sallyport_sessions_rejected_total{door=\"ssh\",reason=\"denied\"}"
            ) >= 1.0
        );
        assert!(text.contains(
            "sallyport_auth_request_duration_seconds_count{method=\"GET\",route=\"/v1/users/{name}\",status=\"4xx\"}"
        ));
        assert!(!text.contains("bob"));
        let left = value(
            &text,
            "sallyport_certificate_expiry_seconds{certificate=\"auth_tls\"}",
        );
        assert!((3590.0..=3600.0).contains(&left), "{left}");
        assert!(value(&text, "sallyport_recording_written_bytes_total") >= 10.0);
        assert_eq!(
            value(
                &text,
                "sallyport_audit_queue_depth{queue=\"auth_audit_writer\"}"
            ),
            0.0
        );
        drop(guard);
    }
}
