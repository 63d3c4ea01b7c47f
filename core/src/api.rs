//! The JSON that crosses the wire between the clients, the proxy's web API (3080) and the auth
//! API (3025). Field names here are a contract with every client version.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::audit::EventType;
pub use crate::role::RecordMode;

mod kinds;
pub use kinds::{ConnectorKind, NodeKind, SessionKind, SessionStatus, TokenKind, UnknownValue};

/// The ALPN protocol that asks the proxy's web port to pipe a TLS connection to auth unopened.
pub const AUTH_ALPN: &[u8] = b"sallyport-auth";

/// The name auth's certificate is checked against by clients that reach it through a proxy's
/// passthrough ([`AUTH_ALPN`]): whichever proxy they dial, the certificate behind it must be
/// auth's. Only auth's certificate carries it (a proxy asking for it at join is refused).
pub const AUTH_SERVER_NAME: &str = "auth.sallyport.cluster.local";

/// Every error body: a message meant for the person at the keyboard, and for a refusal (403)
/// what kind it is, so that a client tells a lock from a limit without reading the text.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ErrorBody {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<RefusalCode>,
}

/// The kind of a refusal by auth (`ErrorBody::code`): each door renders it its own way (an SSH
/// message, a WebSocket close code, a Kubernetes `Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RefusalCode {
    /// The roles do not allow it.
    Denied,
    /// The user is locked (`sallyctl lock`).
    Locked,
    /// A limit of the roles (`max_sessions`, `max_connections`) is reached.
    Limit,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Ping {
    pub cluster_name: String,
    /// `otp` or `off`.
    pub second_factor: String,
    pub server_version: String,
    /// Names of the SSO connectors (`sally login --auth=NAME`).
    #[serde(default)]
    pub auth_connectors: Vec<String>,
    /// Whether any local (password) user exists.
    #[serde(default)]
    pub local_users: bool,
}

/// `sallyctl create` of a `kind: oidc` connector.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PutConnector {
    pub connector: crate::oidc::OidcConnector,
    #[serde(default)]
    pub overwrite: bool,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignupStart {
    pub token: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignupStarted {
    pub user: String,
    /// Present when the cluster requires TOTP: the enrollment URI for an authenticator app.
    pub otpauth_uri: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignupFinish {
    pub token: String,
    pub password: String,
    pub otp_code: Option<String>,
}

/// A login with password and second factor, asking for certificates over `ssh_public_key`.
#[derive(Clone, Serialize, Deserialize)]
pub struct LoginRequest {
    pub user: String,
    pub password: String,
    pub otp_code: Option<String>,
    /// OpenSSH public key (Ed25519) the certificates are bound to.
    pub ssh_public_key: String,
    pub ttl_secs: Option<u64>,
    /// Set by the proxy from the TCP peer; ignored when a client sends it.
    #[serde(default)]
    pub remote_addr: Option<String>,
    /// Set by the proxy when the login opens a browser's web session (audited as
    /// `method: web`); removed from whatever a client sends.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub web: bool,
}

impl std::fmt::Debug for LoginRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginRequest")
            .field("user", &self.user)
            .field("ttl_secs", &self.ttl_secs)
            .finish_non_exhaustive()
    }
}

/// Certificates issued at login.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Certs {
    pub user: String,
    pub roles: Vec<String>,
    pub logins: Vec<String>,
    pub cluster_name: String,
    pub ssh_cert: String,
    pub tls_cert_pem: String,
    /// PEM of the host TLS CA (to trust the proxy) and the user TLS CA.
    pub tls_host_ca_pem: String,
    /// `@cert-authority` lines for the host SSH CA.
    pub known_hosts: Vec<String>,
    /// RFC 3339.
    pub valid_until: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct UserInfo {
    pub name: String,
    #[serde(rename = "type")]
    pub user_type: String,
    pub roles: Vec<String>,
    #[serde(default)]
    pub traits: BTreeMap<String, Vec<String>>,
    /// `active` once signed up, `pending` before.
    pub status: String,
    pub created: String,
    pub locked_until: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AddUser {
    pub name: String,
    pub roles: Vec<String>,
    #[serde(default)]
    pub logins: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignupToken {
    pub user: String,
    pub token: String,
    /// RFC 3339.
    pub expires: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Status {
    pub cluster_name: String,
    /// `sha256:<hex>` pins of the host TLS CA keys (the one clients pass as `--ca-pin` first).
    pub ca_pins: Vec<String>,
    /// SHA-256 fingerprints of the SSH CA keys, by CA.
    pub ssh_ca_fingerprints: BTreeMap<String, Vec<String>>,
    pub users: u64,
    pub roles: u64,
    pub audit_events: u64,
    /// Why auth stopped signing audit checkpoints (the chain in the database no longer
    /// matches the last checkpoint it signed), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub audit_anchoring_stopped: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct CaExport {
    pub kind: String,
    /// Exactly what the file or config line needs.
    pub text: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuditQuery {
    #[serde(rename = "type", default, skip_serializing_if = "Option::is_none")]
    pub event_type: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// Unix seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub since: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub limit: Option<u32>,
    /// Only records naming this node (`node`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    /// Only records of this session (`session_id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// Unix seconds, inclusive: records up to the end of this second.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub until: Option<i64>,
    /// Paging back: only records with `seq` below this (the newest `limit` of them).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub before: Option<i64>,
    /// Paging forward: only records with `seq` above this, the oldest `limit` of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub after: Option<i64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AuditVerify {
    pub ok: bool,
    pub checked: u64,
    /// The sequence number of the first record that was edited or removed.
    pub first_bad_seq: Option<i64>,
    pub message: String,
    /// Records covered by a signed checkpoint (a database writer cannot rewrite them unseen).
    #[serde(default)]
    pub anchored: u64,
    /// Signed checkpoints checked.
    #[serde(default)]
    pub checkpoints: u64,
    /// The SHA-256 fingerprint of the checkpoint key that signed them, for an auditor to pin.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_key: Option<String>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct UpdateUser {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub roles: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logins: Option<Vec<String>>,
}

/// A role sent to auth; auth validates it again whatever the client checked.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PutRole {
    pub role: crate::role::Role,
    #[serde(default)]
    pub overwrite: bool,
    /// Save only over this revision (`Role::revision` of what the editor read): a role changed
    /// or removed since is a 409. Implies `overwrite`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revision: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PutRoleResult {
    pub name: String,
    pub created: bool,
}

/// A pending token (never its secret).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TokenInfo {
    #[serde(rename = "type")]
    pub kind: TokenKind,
    pub user: Option<String>,
    pub expires: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: String,
    pub hostname: String,
    #[serde(default)]
    pub addr: Option<String>,
    pub labels: BTreeMap<String, String>,
    pub kind: NodeKind,
    /// For agents: whether its tunnel is up now.
    #[serde(default)]
    pub online: bool,
    /// When a person lists nodes: the logins their roles allow on this one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logins: Option<Vec<String>>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AddNode {
    pub name: String,
    pub addr: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
}

/// `sallyctl access check`: would `user` be let in?
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AccessCheck {
    pub user: String,
    #[serde(default)]
    pub node: Option<String>,
    #[serde(default)]
    pub login: Option<String>,
    #[serde(default)]
    pub kube_cluster: Option<String>,
    #[serde(default)]
    pub kube_labels: BTreeMap<String, String>,
    /// `kind/namespace/name`.
    #[serde(default)]
    pub kube_resource: Option<String>,
    #[serde(default)]
    pub verb: Option<String>,
}

/// A Kubernetes cluster a kube agent serves (`sally kube ls`, `sallyctl get kube_clusters`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeClusterInfo {
    pub name: String,
    pub id: String,
    /// The agent's labels (without the built-in `kube_cluster`).
    pub labels: BTreeMap<String, String>,
    /// Whether its agent's tunnel is up now.
    pub online: bool,
}

/// `sally kube credentials`: a kubeconfig certificate for one cluster, over the key the caller's
/// own certificate is for.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeCertRequest {
    pub cluster: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeCert {
    pub cert_pem: String,
    /// RFC 3339; never later than the login it came from.
    pub expires: String,
    pub kube_users: Vec<String>,
    pub kube_groups: Vec<String>,
}

/// The proxy asks what one user may do on one cluster: the user's current roles and traits and
/// the cluster's labels, which it evaluates per request (cached for 2 s).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeAccessRequest {
    pub user: String,
    pub cluster: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct KubeAccess {
    pub user: String,
    pub roles: Vec<crate::role::Role>,
    pub traits: crate::identity::Traits,
    pub cluster: KubeClusterInfo,
}

/// One Kubernetes request the proxy decided, for the audit log (`kube.request`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KubeRequestRecord {
    pub user: String,
    pub kube_cluster: String,
    pub method: String,
    pub path: String,
    pub verb: String,
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub response_code: u16,
    pub allowed: bool,
    pub reason: String,
    pub kube_users: Vec<String>,
    pub kube_groups: Vec<String>,
    /// kubectl's `Kubectl-Command` header (`kubectl get`), when sent.
    #[serde(default)]
    pub kubectl_command: Option<String>,
    pub remote_addr: String,
}

/// A `kubectl port-forward` stream opening or ending (`kube.port_forward`): audited, not
/// recorded.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct KubePortForwardRecord {
    pub user: String,
    pub kube_cluster: String,
    pub namespace: String,
    pub pod: String,
    /// The pod's ports, when the request names them (`?ports=`); the tunneled form names them
    /// inside the stream.
    #[serde(default)]
    pub ports: Vec<u16>,
    /// `start` or `stop`.
    pub action: String,
    pub kube_users: Vec<String>,
    pub kube_groups: Vec<String>,
    pub remote_addr: String,
    /// `stop`: how long the stream lasted, and why it ended when the proxy ended it.
    #[serde(default)]
    pub duration_secs: Option<u64>,
    #[serde(default)]
    pub reason: Option<String>,
}

/// What the kube door reports to auth, in the order it happened: a `kube.request` or a
/// `kube.port_forward` event.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "record", rename_all = "snake_case")]
pub enum KubeRecord {
    Request(KubeRequestRecord),
    PortForward(KubePortForwardRecord),
}

/// `sallyctl lock`: stop a user now, until removed or for a while.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AddLock {
    pub user: String,
    #[serde(default)]
    pub message: Option<String>,
    /// Seconds; none locks until the lock is removed.
    #[serde(default)]
    pub ttl_secs: Option<u64>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LockInfo {
    pub id: String,
    pub user: String,
    pub message: String,
    /// RFC 3339, or none: until removed.
    pub expires: Option<String>,
    pub created_by: String,
    pub created: String,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct AddJoinToken {
    /// Only `node` tokens are made this way (sign-up tokens come with a user).
    #[serde(rename = "type")]
    pub kind: TokenKind,
    pub ttl_secs: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct JoinToken {
    pub token: String,
    /// RFC 3339.
    pub expires: String,
}

/// An agent asking to join with a one-time token. The keys are the agent's own; their private
/// halves never leave it.
#[derive(Clone, Serialize, Deserialize)]
pub struct JoinRequest {
    pub token: String,
    pub nodename: String,
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// SubjectPublicKeyInfo (DER, base64) of the agent's TLS key.
    pub tls_spki: String,
    /// OpenSSH public host key.
    pub ssh_host_key: String,
    #[serde(default)]
    pub remote_addr: Option<String>,
}

impl std::fmt::Debug for JoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JoinRequest")
            .field("nodename", &self.nodename)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Joined {
    pub node_id: String,
    pub cluster_name: String,
    pub tls_cert_pem: String,
    pub host_ca_pem: String,
    pub ssh_host_cert: String,
    /// OpenSSH public keys of the user CA: the only keys whose certificates the agent accepts.
    pub user_ca_keys: Vec<String>,
}

/// A proxy service joining with a one-time `proxy` token, straight to auth (port 3025, the one
/// route a caller without a certificate may use). Private keys never leave the proxy.
#[derive(Clone, Serialize, Deserialize)]
pub struct ProxyJoinRequest {
    pub token: String,
    /// The proxy's name in `sallyctl proxies ls` (default: its host name).
    pub name: String,
    /// SubjectPublicKeyInfo (DER, base64) of the proxy's TLS key.
    pub tls_spki: String,
    /// The proxy's OpenSSH public host key (the users' SSH door).
    pub ssh_host_key: String,
    /// Names and addresses its TLS and SSH host certificates are for (what clients dial).
    #[serde(default)]
    pub dns_names: Vec<String>,
}

impl std::fmt::Debug for ProxyJoinRequest {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyJoinRequest")
            .field("name", &self.name)
            .field("dns_names", &self.dns_names)
            .finish_non_exhaustive()
    }
}

/// A proxy's certificates, and the CAs' public keys it checks everyone else with. The same shape
/// answers a renewal (`POST /v1/proxies/{id}/renew`, with a [`ProxyJoinRequest`] whose token is
/// empty).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyJoined {
    pub proxy_id: String,
    pub cluster_name: String,
    /// Its TLS certificate (host TLS CA, O=proxy, CN=`proxy_id`), PEM, then the CA's.
    pub tls_chain_pem: String,
    pub host_ca_pem: String,
    pub user_ca_pem: String,
    /// Its SSH host certificate for the users' door.
    pub ssh_host_cert: String,
    /// OpenSSH public keys of the user and host SSH CAs.
    pub user_ca_keys: Vec<String>,
    pub host_ca_keys: Vec<String>,
    /// When the TLS certificate expires (Unix seconds): the proxy renews before.
    pub not_after: i64,
}

/// Where a proxy is reached: what it tells auth in each heartbeat. Agents dial `tunnel`.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyAddrs {
    #[serde(default)]
    pub web: String,
    #[serde(default)]
    pub ssh: String,
    #[serde(default)]
    pub tunnel: String,
    #[serde(default)]
    pub kube: String,
}

/// A proxy's heartbeat (`POST /v1/proxies/{id}/heartbeat`). `started`: its first since it
/// started, so the agent tunnels and running sessions it had before are gone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ProxyHeartbeat {
    pub addrs: ProxyAddrs,
    #[serde(default)]
    pub started: bool,
}

/// One proxy of the cluster, as `sallyctl proxies ls` and agents see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProxyInfo {
    pub id: String,
    pub name: String,
    pub addrs: ProxyAddrs,
    /// Heard from within the last [`PROXY_TTL_SECS`].
    pub online: bool,
    /// Unix seconds of its last heartbeat.
    pub last_seen: i64,
}

/// A proxy not heard from for this long is offline (it heartbeats every 10 s).
pub const PROXY_TTL_SECS: i64 = 30;

/// An agent's certificates renewed over the keys it already has (`POST
/// /v1/nodes/{id}/renew`, by the proxy its tunnel is to, when the agent asks in a heartbeat).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct RenewRequest {
    /// SubjectPublicKeyInfo (DER, base64) of the agent's TLS key.
    pub tls_spki: String,
    /// Its OpenSSH public host key.
    pub ssh_host_key: String,
}

/// What a renewal certifies.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Renewed {
    pub tls_cert_pem: String,
    pub ssh_host_cert: String,
}

/// The proxy reporting an agent's tunnel (and its current labels).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Presence {
    pub online: bool,
    #[serde(default)]
    pub labels: Option<BTreeMap<String, String>>,
}

/// Most nodes one [`PresenceRefresh`] may name.
pub const MAX_PRESENCE_REFRESH: usize = 5000;

/// The proxy refreshing the presence of agents whose tunnels are still up with unchanged labels
/// (`POST /v1/proxies/{id}/presence`): one request for every node heard from since the last,
/// instead of one [`Presence`] each. A tunnel's first report, new labels and its end are still
/// [`Presence`] reports of their own.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PresenceRefresh {
    pub nodes: Vec<String>,
}

/// Auth's answer to a [`PresenceRefresh`]: the nodes it holds no tunnel of this proxy for (the
/// node was removed, or its presence dropped): the proxy reports each of those on its own,
/// which re-records it or refuses it as today.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PresenceRefreshed {
    #[serde(default)]
    pub unknown: Vec<String>,
}

/// `text` as one segment of an API path: everything but letters, digits and `-._~` is
/// percent-encoded, so a name can never add a segment (`/`), end the path (`?`, `#`) or climb
/// out of it. URL parsers resolve a segment of only dots as a step, even percent-encoded, so
/// such a segment (and an empty one) is sent with a leading `%20`: it then names nothing.
/// Names are validated before this; this is the second line.
pub fn path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 3);
    if text.bytes().all(|b| b == b'.') {
        out.push_str("%20");
    }
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The proxy asking whether `user` may open a session as `login` on `node`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionRequest {
    pub user: String,
    pub login: String,
    pub node: String,
    /// OpenSSH public key of the proxy's per-session key, to certify for `login`.
    pub public_key: String,
    pub remote_addr: String,
    /// Session channels already open on this SSH connection, for the roles' `max_sessions`;
    /// `None` for a connection's forwards, which are not a session channel.
    #[serde(default)]
    pub open_sessions: Option<u32>,
    /// How many of the user's SSH connections through the proxy are older than this one and
    /// still open, for the roles' `max_connections` (the oldest ones are the ones allowed).
    #[serde(default)]
    pub older_connections: u32,
    /// A `kubectl exec` or `attach` on a Kubernetes cluster (`node` is the cluster's id): the
    /// principals were chosen by the door; auth decides it again and signs it into the
    /// session certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kube: Option<crate::kube::KubeExec>,
    /// The person's connection this session runs on, for `max_connections` across proxies:
    /// when a role sets it, auth registers the connection and counts the user's older ones
    /// on every other live proxy too ([`older_connections`](Self::older_connections) are this
    /// proxy's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub connection: Option<ConnectionRef>,
}

/// One of a user's connections to a proxy: the proxy's id for it, when it opened (Unix
/// milliseconds, the proxy's clock; for people reading auth's table), and how many of the
/// user's connections on that proxy opened before it and still open auth has not registered
/// (auth counts the registered ones itself, in the order it registered them).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConnectionRef {
    pub id: u64,
    pub opened_ms: i64,
    #[serde(default)]
    pub unconfirmed_older: u32,
}

/// A proxy's connections that closed, among those auth registered
/// ([`SessionGrant::connection_registered`]), and from time to time the list of every one still
/// open: `POST /v1/connections/closed`.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ClosedConnections {
    pub ids: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub open: Option<OpenConnections>,
}

/// Every connection of a proxy's still open, whole below `below`: auth drops its rows of that
/// proxy with an id below `below` that are not in `ids`. Ids are the proxy's, given in order
/// with the list's lock held, so one opened after the list was made is at `below` or above.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct OpenConnections {
    pub ids: Vec<u64>,
    pub below: u64,
}

/// The most ids one [`ClosedConnections`] carries in `ids`.
pub const MAX_CLOSED_CONNECTIONS: usize = 10_000;
/// The most ids one [`OpenConnections`] carries.
pub const MAX_OPEN_CONNECTIONS: usize = 100_000;

/// Session channels per SSH connection when no role sets `max_sessions` (OpenSSH's own
/// `MaxSessions` default).
pub const DEFAULT_MAX_SESSIONS: u32 = 10;

/// What a person reads when a session channel would go past `max_sessions`; auth says it, and
/// the proxy says the same when it refuses further channels on its own.
pub fn max_sessions_refusal(open: u32, max_sessions: u32) -> String {
    format!(
        "{open} sessions are already open on this connection, the most your roles allow (max_sessions: {max_sessions})"
    )
}

/// Auth's answer when the proxy checks a running session's grant again (a forward's new
/// connection or `-R` bind, an agent or X11 channel the node opens): what the user's current
/// roles still allow. A removed or locked user, or a node the roles no longer reach, is an
/// error instead.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct GrantCheck {
    pub port_forwarding: bool,
    /// For agent and X11 channels a node opens on a running session.
    #[serde(default)]
    pub forward_agent: bool,
    #[serde(default)]
    pub x11_forwarding: bool,
}

/// Auth's answer: the node, the per-session certificate, and what the roles say about the
/// session. A refusal comes back as an error with the role explanation.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionGrant {
    pub session_id: String,
    /// Auth registered the request's connection (a role sets `max_connections`): the proxy
    /// says when it closes ([`ClosedConnections`]).
    #[serde(default)]
    pub connection_registered: bool,
    pub node: NodeInfo,
    pub ssh_cert: String,
    pub record: RecordMode,
    pub port_forwarding: bool,
    pub forward_agent: bool,
    /// `ssh_file_copy`: scp, sftp and rsync. Every role must allow it.
    #[serde(default)]
    pub file_copy: bool,
    #[serde(default)]
    pub x11_forwarding: bool,
    /// `client_idle_timeout`: the session ends after this long with no data either way.
    #[serde(default)]
    pub idle_timeout_secs: Option<u64>,
    /// `disconnect_expired_cert`: the session ends when the person's certificate expires.
    #[serde(default)]
    pub disconnect_expired_cert: bool,
    /// `record_input`: recordings hold what the person typed too (off unless a role asks).
    #[serde(default)]
    pub record_input: bool,
    /// `max_sessions`: session channels one SSH connection may have open.
    #[serde(default)]
    pub max_sessions: Option<u32>,
    /// Host user creation for this login on this node (`create_host_user_mode`, `host_groups`,
    /// `host_sudoers`), when the roles ask for it; the agent reads it from the session
    /// certificate, this copy is for the proxy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_user: Option<crate::role::HostUser>,
    pub explanation: String,
}

/// Events the proxy saw inside a session (`sftp`, `scp`, `port`, `x11-forward`,
/// `agent-forward`); auth adds who, where and which session from its own records.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionEvent {
    pub event: String,
    #[serde(default)]
    pub fields: serde_json::Map<String, serde_json::Value>,
}

/// The session events a proxy may report: those the catalogue says a proxy or an agent
/// reports (`crate::audit::catalogue::Source`).
pub const SESSION_EVENTS: &[&str] = &[
    EventType::Sftp.name(),
    EventType::Scp.name(),
    EventType::Port.name(),
    EventType::X11Forward.name(),
    EventType::AgentForward.name(),
    EventType::SessionRecordingLimit.name(),
    EventType::SessionRecordingFail.name(),
    EventType::HostUserCreate.name(),
];

/// The SSH extended-data type an agent sends its own session events on (`host_user.create`):
/// one JSON [`SessionEvent`] per message, on the session channel, before anything the session
/// writes. Only the agent writes SSH messages (a session's output is data or stderr, type 1),
/// so the proxy takes these as the agent's word, never relays them to the person, and reports
/// only [`AGENT_EVENTS`].
pub const AGENT_EVENT_EXT: u32 = 0x5a11_0001;

/// The session events an agent may report through [`AGENT_EVENT_EXT`].
/// `host_user.create`: the agent created the session's login on its node (roles'
/// `create_host_user_mode`), with the groups and sudoers lines it gave it.
pub const AGENT_EVENTS: &[&str] = &[EventType::HostUserCreate.name()];

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct SessionEnd {
    pub exit_code: Option<i64>,
    pub bytes_in: u64,
    pub bytes_out: u64,
    /// `complete`, or `incomplete` when the recording could not be finished (`running` in an
    /// update, which auth does not read).
    pub status: SessionStatus,
    #[serde(default)]
    pub kind: Option<SessionKind>,
    #[serde(default)]
    pub command: Option<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionInfo {
    pub session_id: String,
    pub user: String,
    pub login: String,
    pub node: String,
    pub start: String,
    pub end: Option<String>,
    pub exit_code: Option<i64>,
    pub status: SessionStatus,
    pub kind: SessionKind,
    pub command: Option<String>,
}

/// One session as `GET /v1/sessions/{id}` gives it: its record and its recording's size now
/// (`None` when no recording is kept; a live session's grows).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub session: SessionInfo,
    #[serde(default)]
    pub recording_size: Option<u64>,
}

/// The reason of a proxy's report of failures its full report queue dropped (with their
/// `count`): the audit log says how many went unrecorded instead of losing them silently.
pub const AUTH_FAILURES_DROPPED: &str = "reports dropped: queue full";

/// A failed authentication a proxy saw at one of its doors (`POST /v1/auth-failures`, in
/// batches). Auth audits these as `auth.fail`, aggregated per (door, address, reason).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct AuthFailure {
    /// `ssh` or `tunnel` (auth's own door is `api`).
    pub door: String,
    pub remote_addr: String,
    /// Why it failed, in words an admin can act on.
    pub reason: String,
    /// The user name the client asked for, if any (not a verified identity).
    #[serde(default)]
    pub user: Option<String>,
    /// What the client presented: `key_fingerprint`, `cert_key_id`, `ca_fingerprint`, ...
    #[serde(default)]
    pub presented: BTreeMap<String, String>,
    /// How many failures this report stands for (none: one). Set only on a proxy's report of
    /// the reports its full queue dropped.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
}

/// A browser's web session as auth keeps it for every proxy (`POST /v1/web-sessions`): the
/// proxy that signed the browser in made the key and the cookie's id, and sends the id's
/// SHA-256 (hex), never the id. Any proxy behind the same load balancer looks it up by that hash.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebSessionRecord {
    /// Hex SHA-256 of the cookie's id.
    pub id_hash: String,
    pub user: String,
    pub roles: Vec<String>,
    pub logins: Vec<String>,
    /// The session's user TLS certificate (PEM), and its private key (PKCS#8 PEM).
    pub cert_chain_pem: String,
    pub key_pem: String,
    pub csrf_token: String,
    /// Unix milliseconds.
    pub created_ms: u64,
    pub last_input_ms: u64,
    /// The certificate's expiry (Unix seconds) and the same as RFC 3339.
    pub expires: u64,
    pub valid_until: String,
    /// `web_idle_timeout` of the proxy that opened it, in milliseconds: every proxy ends the
    /// session after this long without input.
    pub idle_ms: u64,
}

/// Auth's answer to a new web session: the sessions it ended to make room (`MAX_PER_USER`,
/// `MAX_SESSIONS`), by hash, so the proxy that asked ends their terminals at once.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WebSessionCreated {
    pub evicted: Vec<String>,
}

/// Web sessions one user may hold at once, and the cluster: signing in past either ends the
/// oldest.
pub const MAX_WEB_SESSIONS_PER_USER: usize = 32;
pub const MAX_WEB_SESSIONS: usize = 10_000;

/// A web session's terminals close with 4401 when it is signed out, idle, evicted or expired,
/// and with 4409 when its user is locked.
pub const WEB_CLOSE_SIGNED_OUT: u16 = 4401;
pub const WEB_CLOSE_LOCKED: u16 = 4409;

/// Why a web session ended, as its terminals are closed: a WebSocket close code and words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WebSessionEnding {
    pub code: u16,
    pub message: String,
}

/// A proxy's input on a web session (`POST /v1/web-sessions/{hash}/touch`): the latest wins.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebSessionTouch {
    pub last_input_ms: u64,
}

/// Which of these web sessions still exist (`POST /v1/web-sessions/check`), asked by a proxy
/// for the ones it holds every ~2 s.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct WebSessionCheck {
    pub id_hashes: Vec<String>,
}

/// One asked session that auth still knows: live (`ended` none) with its latest input, or
/// ended a moment ago and why. A session asked and not answered is gone.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebSessionState {
    pub id_hash: String,
    pub last_input_ms: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ended: Option<WebSessionEnding>,
}

/// A browser's SSO sign-in waiting for the browser to come back (`POST /v1/web-sso`): under the
/// hash of its binding cookie, the secret its response is redeemed with and the key its web
/// session will hold. Any proxy may finish it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WebSsoPending {
    /// Hex SHA-256 of the binding cookie's value.
    pub binding_hash: String,
    pub client_key: String,
    pub key_pem: String,
}

#[cfg(test)]
mod path_segment_tests {
    use super::path_segment;

    #[test]
    fn a_segment_stays_one_segment() {
        for (text, want) in [
            ("web1", "web1"),
            ("a.b-c_d~e", "a.b-c_d~e"),
            ("../oidc/callback#", "..%2Foidc%2Fcallback%23"),
            ("x?y=1", "x%3Fy%3D1"),
            ("a b%", "a%20b%25"),
            ("..", "%20.."),
            (".", "%20."),
            ("", "%20"),
            ("é", "%C3%A9"),
        ] {
            assert_eq!(path_segment(text), want, "{text:?}");
        }
        // And a URL parser keeps it where it was put.
        for text in ["..", ".", "../x", "a/../../b", "#", "?"] {
            let url = format!(
                "https://auth/v1/nodes/{}/proxy-host-cert",
                path_segment(text)
            );
            let parsed = url::Url::parse(&url).unwrap_or_else(|e| panic!("{url}: {e}"));
            let segs: Vec<&str> = parsed
                .path_segments()
                .map(|s| s.collect())
                .unwrap_or_default();
            assert_eq!(segs.len(), 4, "{text:?} -> {}", parsed.path());
            assert_eq!(segs[3], "proxy-host-cert");
            assert!(parsed.fragment().is_none() && parsed.query().is_none());
        }
    }
}
