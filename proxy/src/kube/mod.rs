//! The Kubernetes door (port 3026): `kubectl` with a kubeconfig certificate from
//! `sally kube login`. Each request is decided here, by the person's current roles (auth's
//! answer, at most 2 s old), on the path the API server will see; the door then impersonates the
//! principals the roles allow for that request and sends it through the cluster's kube agent
//! tunnel. Every request, allowed or not, is audited as `kube.request`. A list or watch the
//! roles allow only some items of is forwarded and comes back with those items only (`filter`).
//!
//! Architecture invariant: nothing reaches a cluster that the door did not decide. A request
//! whose path could be read two ways is refused (400); the person's `Authorization` and
//! `Impersonate-*` headers never pass; a refusal is a `metav1.Status` that names no address,
//! credential or internal error, and nothing of it reaches the agent.
//!
//! exec and attach run through the session engine, which records them (`exec`); port-forward
//! streams are audited and piped (`forward`); every other upgrade is refused.

pub mod access;
pub mod audit;
pub mod exec;
pub mod filter;
pub mod forward;
pub mod ports;
pub mod spdy;
mod streams;

use std::sync::Arc;

use axum::extract::{Extension, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::KubeRequestRecord;
use sallyport_core::https::{PeerCertificates, RemoteAddr};
use sallyport_core::kube::{AskedImpersonation, Classified, KubeCertExt, classify, status};

use crate::state::ProxyState;
use access::{AccessCache, Refused};
use audit::RequestAudit;

/// Where kubectl's requests for a cluster arrive: `/kube/CLUSTER/...`.
pub const PREFIX: &str = "/kube/";

pub struct KubeDoor {
    pub state: Arc<ProxyState>,
    pub access: AccessCache,
    pub audit: RequestAudit,
}

impl KubeDoor {
    pub fn new(state: Arc<ProxyState>) -> Arc<Self> {
        Arc::new(KubeDoor {
            access: AccessCache::new(state.auth.clone()),
            audit: RequestAudit::start(state.auth.clone()),
            state,
        })
    }
}

/// The door's router: every path goes to [`handle`].
pub fn router(door: Arc<KubeDoor>) -> axum::Router {
    axum::Router::new().fallback(handle).with_state(door)
}

/// A refusal kubectl prints: the Status body with the same code.
fn refuse(code: StatusCode, message: &str) -> Response {
    let reason = sallyport_core::kube::reason_for(code.as_u16());
    let mut resp = (code, axum::Json(status(code.as_u16(), reason, message))).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

/// [`refuse`], for a discovery request as plain text: kubectl reads discovery with
/// `Result::Raw`, which prints a JSON error as "unknown" and a text one as it is.
fn refuse_as(c: &Classified, code: StatusCode, message: &str) -> Response {
    if !c.discovery {
        return refuse(code, message);
    }
    let mut resp = (code, message.to_string()).into_response();
    resp.headers_mut().insert(
        header::CACHE_CONTROL,
        header::HeaderValue::from_static("no-store"),
    );
    resp
}

/// What the audit record says of a request, filled in as it is decided.
struct Audit {
    record: KubeRequestRecord,
}

impl Audit {
    /// The record, its fields cut to bounded lengths (the path a person sends is theirs to
    /// choose, and every record waits in a queue and travels in a batch).
    fn finish(mut self, code: StatusCode, allowed: bool, reason: &str) -> KubeRequestRecord {
        fn cut(s: &mut String, max: usize) {
            if s.len() > max {
                let mut at = max;
                while !s.is_char_boundary(at) {
                    at -= 1;
                }
                s.truncate(at);
                s.push('…');
            }
        }
        let r = &mut self.record;
        r.response_code = code.as_u16();
        r.allowed = allowed;
        r.reason = reason.to_string();
        cut(&mut r.path, sallyport_core::kube::MAX_PATH);
        cut(&mut r.reason, 2048);
        for f in [&mut r.kind, &mut r.namespace, &mut r.name, &mut r.method] {
            cut(f, 512);
        }
        self.record
    }
}

fn asked_impersonation(headers: &HeaderMap) -> AskedImpersonation {
    let mut asked = AskedImpersonation::default();
    for (k, v) in headers {
        let k = k.as_str();
        if !k.starts_with("impersonate-") {
            continue;
        }
        let v = v.to_str().unwrap_or_default().to_string();
        match k {
            "impersonate-user" => asked.users.push(v),
            "impersonate-group" => asked.groups.push(v),
            other => asked.other.push(other.to_string()),
        }
    }
    asked
}

/// The person a kubeconfig certificate names, and the cluster it is for.
fn identify(peer: Option<&PeerCertificates>) -> Result<(String, KubeCertExt), String> {
    let login = "this door takes the certificates `sally kube login CLUSTER` sets up for kubectl";
    let leaf = peer
        .and_then(|p| p.0.first())
        .ok_or_else(|| format!("no client certificate: {login}"))?;
    let subject = sallyport_core::x509::parse_subject(leaf)
        .map_err(|_| format!("unreadable certificate: {login}"))?;
    if subject.not_after <= sallyport_core::unix_now() {
        return Err("the certificate has expired: run `sally login`".into());
    }
    let ext = KubeCertExt::from_cert(leaf)
        .ok_or_else(|| format!("not a Kubernetes certificate: {login}"))?;
    Ok((subject.common_name, ext))
}

async fn handle(
    State(door): State<Arc<KubeDoor>>,
    peer: Option<Extension<PeerCertificates>>,
    remote: Option<Extension<RemoteAddr>>,
    mut req: Request,
) -> Response {
    let remote_addr = remote.map(|r| r.0.0.to_string()).unwrap_or_default();
    let (user, ext) = match identify(peer.as_deref()) {
        Ok(id) => id,
        Err(why) => return refuse(StatusCode::UNAUTHORIZED, &why),
    };
    // The methods the Kubernetes API has; anything else is no request of its.
    if !matches!(
        req.method().as_str(),
        "GET" | "HEAD" | "POST" | "PUT" | "PATCH" | "DELETE" | "OPTIONS"
    ) {
        return refuse(
            StatusCode::METHOD_NOT_ALLOWED,
            "the Kubernetes API takes GET, HEAD, POST, PUT, PATCH, DELETE and OPTIONS",
        );
    }
    let path = req.uri().path().to_string();
    let query = req.uri().query().unwrap_or_default().to_string();
    let mut audit = Audit {
        record: KubeRequestRecord {
            user: user.clone(),
            kube_cluster: ext.kube_cluster.clone(),
            method: req.method().to_string(),
            path: path.clone(),
            kubectl_command: req
                .headers()
                .get("kubectl-command")
                .and_then(|v| v.to_str().ok())
                .map(|v| v.chars().take(256).collect()),
            remote_addr,
            ..Default::default()
        },
    };
    // `/kube/CLUSTER` and what follows it, which is what the API server sees.
    let Some((cluster, rest)) = path.strip_prefix(PREFIX).map(|p| {
        p.split_once('/')
            .map_or((p, "/".to_string()), |(c, r)| (c, format!("/{r}")))
    }) else {
        let why = format!("Kubernetes requests go to {PREFIX}CLUSTER/...");
        door.audit
            .record(audit.finish(StatusCode::NOT_FOUND, false, &why))
            .await;
        return refuse(StatusCode::NOT_FOUND, &why);
    };
    audit.record.path = rest.clone();
    if cluster != ext.kube_cluster {
        let why = format!(
            "this certificate is for cluster {}: run `sally kube login {cluster}`",
            ext.kube_cluster
        );
        door.audit
            .record(audit.finish(StatusCode::FORBIDDEN, false, &why))
            .await;
        return refuse(StatusCode::FORBIDDEN, &why);
    }
    let c = match classify(req.method().as_str(), &rest, &query) {
        Ok(c) => c,
        Err(e) => {
            door.audit
                .record(audit.finish(StatusCode::BAD_REQUEST, false, &e.0))
                .await;
            return refuse(StatusCode::BAD_REQUEST, &e.0);
        }
    };
    audit.record.verb = c.verb.to_string();
    audit.record.kind = if c.discovery {
        String::new()
    } else {
        c.kind.clone()
    };
    audit.record.namespace = c.namespace.clone();
    audit.record.name = c.name.clone();
    let snap = match door.access.get(&user, cluster).await {
        Ok(s) => s,
        Err(r) => {
            let (code, why) = match r {
                Refused::NoCluster => (
                    StatusCode::NOT_FOUND,
                    format!("Kubernetes cluster {cluster} is not registered"),
                ),
                Refused::Denied(m) => (StatusCode::FORBIDDEN, m),
                Refused::Unavailable => (
                    StatusCode::SERVICE_UNAVAILABLE,
                    "the access service is unavailable; try again".to_string(),
                ),
            };
            door.audit.record(audit.finish(code, false, &why)).await;
            return refuse_as(&c, code, &why);
        }
    };
    // A list or watch the roles allow only some items of is forwarded and filtered.
    let filter = match decide(&snap, &c) {
        Ok(f) => f,
        Err(why) => {
            door.audit
                .record(audit.finish(StatusCode::FORBIDDEN, false, &why))
                .await;
            return refuse_as(&c, StatusCode::FORBIDDEN, &why);
        }
    };
    let request = (!c.discovery).then(|| c.request());
    let (groups, users) = match &filter {
        Some(f) => (f.groups.clone(), f.users.clone()),
        None => snap
            .roles
            .kube_principals_for(&snap.labels, request.as_ref()),
    };
    let principals = match sallyport_core::kube::impersonate(
        &user,
        &users,
        &groups,
        &asked_impersonation(req.headers()),
    ) {
        Ok(p) => p,
        Err(why) => {
            door.audit
                .record(audit.finish(StatusCode::FORBIDDEN, false, &why))
                .await;
            return refuse_as(&c, StatusCode::FORBIDDEN, &why);
        }
    };
    audit.record.kube_users = vec![principals.user.clone()];
    audit.record.kube_groups = principals.groups.clone();
    if c.is_exec() {
        let peer_expiry = peer_expiry(peer.as_deref());
        let (code, resp, why) = open_exec(
            &door,
            req,
            &c,
            &query,
            &snap,
            principals,
            &audit.record.remote_addr,
            peer_expiry,
        )
        .await;
        let allowed = code == StatusCode::SWITCHING_PROTOCOLS;
        door.audit.record(audit.finish(code, allowed, &why)).await;
        return resp;
    }
    let Some(opener) = door.state.tunnels.get_kube(&snap.cluster.id) else {
        let why = format!("Kubernetes cluster {cluster} is offline: its agent is not connected");
        door.audit
            .record(audit.finish(StatusCode::SERVICE_UNAVAILABLE, false, &why))
            .await;
        return refuse_as(&c, StatusCode::SERVICE_UNAVAILABLE, &why);
    };
    // A stream the door does not read is a port-forward's, audited as one; any other upgrade
    // (a WebSocket through `pods/proxy`, say) would be an unrecorded, unaudited pipe.
    let upgrade = forward::is_upgrade(req.headers());
    if upgrade && !c.is_portforward() {
        let why = "this proxy upgrades only exec, attach and port-forward requests";
        door.audit
            .record(audit.finish(StatusCode::FORBIDDEN, false, why))
            .await;
        return refuse_as(&c, StatusCode::FORBIDDEN, why);
    }
    let client_upgrade = upgrade.then(|| hyper::upgrade::on(&mut req));
    // A list filtered here is asked for whole: a page's `continue` token names the last item
    // of the page as the API server saw it, hidden or not, so paging would spell out what the
    // roles hide.
    let query = match &filter {
        Some(_) => filter::whole_list_query(&query),
        None => query,
    };
    let path_and_query = if query.is_empty() {
        rest.clone()
    } else {
        format!("{rest}?{query}")
    };
    let (mut parts, body) = req.into_parts();
    if let Some(f) = &filter
        && let Err(r) = f.ask_for_json(&mut parts.headers)
    {
        door.audit.record(audit.finish(r.code, false, &r.why)).await;
        return r.response();
    }
    let up = match forward::upstream_request(
        parts.method,
        &path_and_query,
        parts.headers,
        body,
        &principals.user,
        &principals.groups,
        &audit.record.remote_addr,
    ) {
        Ok(r) => r,
        Err(why) => {
            let why = format!("impersonation request has been denied, {why}");
            door.audit
                .record(audit.finish(StatusCode::FORBIDDEN, false, &why))
                .await;
            return refuse_as(&c, StatusCode::FORBIDDEN, &why);
        }
    };
    let pf = c.is_portforward().then(|| {
        port_forward(
            &door,
            &snap,
            &c,
            &query,
            &principals,
            &audit.record,
            peer_expiry(peer.as_deref()),
        )
    });
    let (control, pf) = match pf {
        Some((control, pf)) => (Some(control), Some(pf)),
        None => (None, None),
    };
    // Forwarded and audited on a task of its own: a client that resets its stream once the
    // request is on its way cannot take the audit record with it.
    let (state, user) = (door.state.clone(), snap.user.clone());
    let (verb, discovery, cluster) = (c.verb, c.discovery, cluster.to_string());
    let task = tokio::spawn(async move {
        let as_c = Classified {
            discovery,
            ..Default::default()
        };
        match forward::forward(&opener, up, client_upgrade, control).await {
            Ok(resp) => {
                let (resp, allowed, why) = match &filter {
                    Some(f) => f.narrow(resp).await,
                    None => (resp, true, "allowed".to_string()),
                };
                let code = resp.status();
                door.audit.record(audit.finish(code, allowed, &why)).await;
                if let Some(pf) = pf {
                    pf.started(&door, code == StatusCode::SWITCHING_PROTOCOLS)
                        .await;
                }
                // A watch, `logs -f` or any answer still streaming is a live connection of its
                // user: a lock ends it, as it ends an exec.
                if code.is_success() {
                    streams::until_locked(&state, &user, resp)
                } else {
                    resp
                }
            }
            Err(e) => {
                // A full tunnel is the person's answer (and audited), not the operator's news.
                if matches!(e, forward::ForwardError::Busy(_)) {
                    tracing::debug!(cluster, verb, error = %e, "kube request not forwarded");
                } else {
                    tracing::warn!(cluster, verb, error = %e, "kube request not forwarded");
                }
                if let Some(pf) = pf {
                    pf.started(&door, false).await;
                }
                let why = match e {
                    forward::ForwardError::Busy(_) => {
                        format!(
                            "Kubernetes cluster {cluster} is busy: {e}; try again when some end"
                        )
                    }
                    _ => format!("Kubernetes cluster {cluster} did not answer; try again"),
                };
                door.audit
                    .record(audit.finish(StatusCode::SERVICE_UNAVAILABLE, true, &why))
                    .await;
                refuse_as(&as_c, StatusCode::SERVICE_UNAVAILABLE, &why)
            }
        }
    });
    match task.await {
        Ok(resp) => resp,
        Err(e) => {
            tracing::error!(error = %e, "a kube request's task failed");
            refuse(
                StatusCode::INTERNAL_SERVER_ERROR,
                "the request could not be completed",
            )
        }
    }
}

/// The roles' decision on one request: discovery is open to everyone who reaches the cluster;
/// a list or watch the roles allow only some items of comes with the filter that keeps them.
fn decide(snap: &Arc<access::Snapshot>, c: &Classified) -> Result<Option<filter::Filter>, String> {
    if c.discovery {
        return if snap.roles.can_see_kube(&snap.labels) {
            Ok(None)
        } else {
            Err(format!(
                "your roles do not allow Kubernetes cluster {}",
                snap.cluster.name
            ))
        };
    }
    let d = snap.roles.check_kube(&snap.labels, &c.request());
    // Deleting a collection cannot be filtered: it must be allowed for every item in it, so a
    // deny rule naming some items cannot be stepped around.
    if c.verb == "deletecollection"
        && d.allowed
        && !snap
            .roles
            .kube_allows_whole_list(&snap.labels, &c.kind, &c.namespace, c.verb)
    {
        return Err(format!(
            "{} may not delete every {} in {}: a role denies some of them, or allows only some",
            snap.user,
            c.kind,
            if c.namespace.is_empty() {
                "any namespace"
            } else {
                &c.namespace
            }
        ));
    }
    let explanation = match filter::decide(snap, c, d) {
        Ok(f) => return Ok(f),
        Err(why) => why,
    };
    let what = match (c.name.is_empty(), c.namespace.is_empty()) {
        (true, true) => c.kind.clone(),
        (true, false) => format!("{} in namespace {}", c.kind, c.namespace),
        (false, true) => format!("{} {:?}", c.kind, c.name),
        (false, false) => format!("{} {:?} in namespace {}", c.kind, c.name, c.namespace),
    };
    Err(format!(
        "{} may not {} {what}: {}",
        snap.user, c.verb, explanation
    ))
}

/// The node the engine dials for a cluster: its kube agent.
fn cluster_node(c: &sallyport_core::api::KubeClusterInfo) -> sallyport_core::api::NodeInfo {
    sallyport_core::api::NodeInfo {
        id: c.id.clone(),
        hostname: c.name.clone(),
        addr: None,
        labels: c.labels.clone(),
        kind: sallyport_core::api::NodeKind::Kube,
        online: c.online,
        logins: None,
    }
}

/// An exec or attach: granted and dialed through the session engine before kubectl is
/// answered, so that a refusal is an HTTP Status; then the WebSocket runs the session.
#[allow(clippy::too_many_arguments)]
async fn open_exec(
    door: &Arc<KubeDoor>,
    req: Request,
    c: &Classified,
    query: &str,
    snap: &access::Snapshot,
    principals: sallyport_core::kube::Principals,
    remote_addr: &str,
    cert_expires: u64,
) -> (StatusCode, Response, String) {
    use crate::session::Refusal;
    use axum::extract::FromRequestParts;
    let fail = |code: StatusCode, why: String| (code, refuse(code, &why), why);
    let offered: Vec<String> = req
        .headers()
        .get_all("sec-websocket-protocol")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|p| p.trim().to_string())
        .collect();
    let protocol = [exec::V5, exec::V4]
        .into_iter()
        .find(|p| offered.iter().any(|o| o == p));
    let websocket = req
        .headers()
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.eq_ignore_ascii_case("websocket"));
    // WebSocket (v5, v4), else SPDY/3.1 (v4): kubectl's first try and its fallback.
    let ws_protocol = protocol.filter(|_| websocket);
    let spdy_protocol = spdy::offered(req.headers()).filter(|_| !websocket);
    let Some(protocol) = ws_protocol.or(spdy_protocol) else {
        return fail(
            StatusCode::BAD_REQUEST,
            format!(
                "exec and attach run over WebSocket ({} or {}) or SPDY/3.1 ({}); this request offers neither",
                exec::V5,
                exec::V4,
                spdy::PROTOCOL
            ),
        );
    };
    let q = match exec::read_query(query, &c.subresource) {
        Ok(q) => q,
        Err(why) => return fail(StatusCode::BAD_REQUEST, why),
    };
    let kube = sallyport_core::kube::KubeExec {
        namespace: c.namespace.clone(),
        pod: c.name.clone(),
        container: q.container.clone(),
        subresource: c.subresource.clone(),
        command: q.command.clone(),
        tty: q.tty,
        stdin: q.stdin,
        kube_user: principals.user.clone(),
        kube_groups: principals.groups.clone(),
        // Over SPDY as Kubernetes names a protocol carried inside another.
        protocol: if ws_protocol.is_some() {
            protocol.to_string()
        } else {
            format!("{}+{protocol}", spdy::UPGRADE)
        },
    };
    let Ok(addr) = remote_addr.parse() else {
        return fail(StatusCode::BAD_REQUEST, "no client address".into());
    };
    let counted = Arc::new(door.state.open_connection(&snap.user));
    let target = crate::session::Target {
        user: snap.user.clone(),
        login: principals.user.clone(),
        node: cluster_node(&snap.cluster),
        addr,
        cert_expires,
        open_sessions: Some(0),
        // An exec is a connection of its user for the roles' `max_connections`, as an SSH
        // connection is.
        connection: Some(counted.clone()),
        credential_refusal: None,
        kube: Some(kube.clone()),
        door: sallyport_core::metrics::SessionDoor::Kube,
    };
    enum Upgrade {
        WebSocket(axum::extract::ws::WebSocketUpgrade),
        Spdy(hyper::upgrade::OnUpgrade, spdy::Expected),
    }
    let upgrade = if ws_protocol.is_some() {
        let (mut parts, _body) = req.into_parts();
        match axum::extract::ws::WebSocketUpgrade::from_request_parts(&mut parts, &()).await {
            Ok(u) => Upgrade::WebSocket(u),
            Err(e) => return fail(StatusCode::BAD_REQUEST, e.body_text()),
        }
    } else {
        let mut req = req;
        Upgrade::Spdy(hyper::upgrade::on(&mut req), spdy::Expected::of(&q))
    };
    let opened = match crate::session::relay::open(door.state.clone(), &target, None).await {
        Ok(o) => o,
        Err(r) => {
            let code = match &r {
                Refusal::Offline(_) => StatusCode::SERVICE_UNAVAILABLE,
                Refusal::Denied { .. } | Refusal::Locked(_) => StatusCode::FORBIDDEN,
                Refusal::Expired(_) => StatusCode::UNAUTHORIZED,
                Refusal::Limit(_) => StatusCode::TOO_MANY_REQUESTS,
                Refusal::HostKey(_) | Refusal::Failed(_) => StatusCode::BAD_GATEWAY,
            };
            // What went wrong inside (a host key, a dial) is the admin's to read, in the log.
            let said = match &r {
                Refusal::HostKey(_) | Refusal::Failed(_) => {
                    tracing::warn!(user = %snap.user, cluster = %snap.cluster.name, error = %r, "kube exec not opened");
                    format!(
                        "the session could not be opened on cluster {}; try again, or ask an administrator to look at the proxy's log",
                        snap.cluster.name
                    )
                }
                _ => r.to_string(),
            };
            return fail(code, said);
        }
    };
    let state = door.state.clone();
    // Granted and dialed: ended in auth if kubectl never completes the upgrade.
    let pending = exec::Pending::new(state.clone(), opened);
    let resp = match upgrade {
        Upgrade::WebSocket(ws) => ws
            .protocols([protocol])
            .max_message_size(exec::MAX_MESSAGE)
            .on_upgrade(move |ws| exec::run(state, target, kube, pending, counted, ws)),
        Upgrade::Spdy(on_upgrade, expected) => {
            tokio::spawn(spdy::run(
                state, target, kube, expected, pending, counted, on_upgrade,
            ));
            spdy::switching(protocol)
        }
    };
    (
        StatusCode::SWITCHING_PROTOCOLS,
        resp,
        format!("allowed: {protocol}"),
    )
}

/// When the person's certificate expires (Unix seconds; 0 when unknown).
fn peer_expiry(peer: Option<&PeerCertificates>) -> u64 {
    peer.and_then(|p| p.0.first())
        .and_then(|l| sallyport_core::x509::parse_subject(l).ok())
        .map_or(0, |s| s.not_after.max(0) as u64)
}

/// A port-forward being opened: audited when it starts and when it ends, ended by a lock or
/// (with `disconnect_expired_cert`) when the person's certificate expires. Its bytes are not
/// recorded.
struct PortForward {
    record: sallyport_core::api::KubePortForwardRecord,
    id: u64,
    ended: tokio::sync::oneshot::Receiver<Option<String>>,
    stop: Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<String>>>>,
    expires: Option<u64>,
    /// The pod ports the streams named (`ports`).
    seen: ports::Seen,
}

struct StopPipe(Arc<std::sync::Mutex<Option<tokio::sync::oneshot::Sender<String>>>>);

impl crate::state::HangUp for StopPipe {
    fn hang_up(&self, why: String) {
        if let Some(tx) = self.0.lock().ok().and_then(|mut s| s.take()) {
            let _ = tx.send(why);
        }
    }
}

fn port_forward(
    door: &Arc<KubeDoor>,
    snap: &access::Snapshot,
    c: &Classified,
    query: &str,
    principals: &sallyport_core::kube::Principals,
    request: &KubeRequestRecord,
    cert_expires: u64,
) -> (forward::PipeControl, PortForward) {
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
    let (ended_tx, ended_rx) = tokio::sync::oneshot::channel();
    let ports = url::form_urlencoded::parse(query.as_bytes())
        .filter(|(k, _)| k == "ports")
        .flat_map(|(_, v)| {
            v.split(',')
                .filter_map(|p| p.trim().parse::<u16>().ok())
                .collect::<Vec<_>>()
        })
        .collect();
    let stop = Arc::new(std::sync::Mutex::new(Some(stop_tx)));
    let seen = ports::Seen::default();
    let id = crate::state::next_id();
    door.state
        .track(id, &snap.user, Arc::new(StopPipe(stop.clone())));
    let pf = PortForward {
        record: sallyport_core::api::KubePortForwardRecord {
            user: snap.user.clone(),
            kube_cluster: snap.cluster.name.clone(),
            namespace: c.namespace.clone(),
            pod: c.name.clone(),
            ports,
            action: "start".into(),
            kube_users: vec![principals.user.clone()],
            kube_groups: principals.groups.clone(),
            remote_addr: request.remote_addr.clone(),
            duration_secs: None,
            reason: None,
        },
        id,
        ended: ended_rx,
        stop,
        expires: snap.roles.disconnect_expired_cert().then_some(cert_expires),
        seen: seen.clone(),
    };
    (
        forward::PipeControl {
            stop: stop_rx,
            ended: ended_tx,
            ports: seen,
        },
        pf,
    )
}

impl PortForward {
    /// The stream is open (or not: then nothing is audited but the request).
    async fn started(self, door: &Arc<KubeDoor>, upgraded: bool) {
        if !upgraded {
            door.state.untrack(self.id);
            return;
        }
        door.audit.port_forward(self.record.clone()).await;
        let door = door.clone();
        let began = std::time::Instant::now();
        if let Some(at) = self.expires {
            let stop = self.stop.clone();
            tokio::spawn(async move {
                let left = at.saturating_sub(sallyport_core::unix_now().max(0) as u64);
                tokio::time::sleep(std::time::Duration::from_secs(left)).await;
                StopPipe(stop).hang_up_expired();
            });
        }
        tokio::spawn(async move {
            let why = self.ended.await.ok().flatten();
            door.state.untrack(self.id);
            let mut record = self.record;
            // The stop names every port the streams reached (kubectl names them there, not in
            // the URL the start had).
            if let Ok(seen) = self.seen.lock() {
                record.ports.extend(seen.iter().copied());
            }
            record.ports.sort_unstable();
            record.ports.dedup();
            record.action = "stop".into();
            record.duration_secs = Some(began.elapsed().as_secs());
            record.reason = why;
            door.audit.port_forward(record).await;
        });
    }
}

impl StopPipe {
    fn hang_up_expired(&self) {
        use crate::state::HangUp;
        self.hang_up("the certificate expired (disconnect_expired_cert)".into());
    }
}
