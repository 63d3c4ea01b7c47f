//! The audit event catalogue: every event type Sallyport writes to the audit log, when it is
//! written and what its fields mean. This module owns the names: emitters name an event only
//! through [`EventType`], searches map a former name to its current one here, and
//! `docs/audit.md` (the auditors' reference) is checked against it by a test, so the three cannot
//! drift.
//!
//! Names are `resource.verb` with the verb in its plain form (`user.create`, `session.start`,
//! `role.delete`), as most of Teleport's and most of ours were; the few that name a thing rather
//! than an act (`exec`, `scp`, `sftp`, `port`, `x11-forward`, `agent-forward`,
//! `session.recording_limit`) keep Teleport's names. Names written in the past form before the
//! catalogue existed are listed as the event's former name: records already in the chain keep
//! them (they are hashed and cannot be rewritten), and a search for either name finds both.
//!
//! Every record also carries the fields of [`COMMON_FIELDS`], which [`super::seal`] adds.

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Who writes an event into the log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// Auth, from its own decisions.
    Auth,
    /// A proxy reports it for a session (`POST /v1/sessions/{id}/events`); auth adds
    /// `session_id`, `login` and `node` from the session's own record, never from the report.
    Proxy,
    /// A node's agent reports it on the session channel; the proxy passes it on as its own
    /// session events.
    Agent,
}

/// One field of an event, and what it holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Field {
    pub name: &'static str,
    pub doc: &'static str,
}

/// The fields [`super::seal`] writes into every record, whatever its event.
pub const COMMON_FIELDS: &[Field] = &[
    Field {
        name: "event",
        doc: "the event type (this catalogue's name)",
    },
    Field {
        name: "time",
        doc: "when auth wrote the record, RFC 3339 UTC",
    },
    Field {
        name: "uid",
        doc: "a random UUID naming this record",
    },
    Field {
        name: "cluster_name",
        doc: "the cluster that wrote it",
    },
    Field {
        name: "user",
        doc: "who acted: the admin for changes, the person for logins and sessions; null when no one is known (an agent joining, a failure before any name)",
    },
    Field {
        name: "v",
        doc: "the record format version (1)",
    },
    Field {
        name: "seq",
        doc: "the record's place in the chain, from 1",
    },
    Field {
        name: "prev_hash",
        doc: "the previous record's `hash`",
    },
    Field {
        name: "hash",
        doc: "SHA-256 over `prev_hash` and the record's canonical JSON without `hash`",
    },
];

macro_rules! catalogue {
    ($(
        $(#[doc = $when:literal])+
        $variant:ident = $name:literal $(, was $old:literal)?, by $source:ident {
            $($field:literal : $fdoc:literal),* $(,)?
        }
    )+) => {
        /// Every audit event type, by its name in the log. The doc of each is what
        /// `docs/audit.md` says of it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum EventType {
            $( $(#[doc = $when])+ $variant, )+
        }

        impl EventType {
            /// Every event type, in the catalogue's order.
            pub const ALL: &'static [EventType] = &[$(EventType::$variant),+];

            /// The name written in the record's `event` field.
            pub const fn name(self) -> &'static str {
                match self { $(EventType::$variant => $name,)+ }
            }

            /// The name records written before the catalogue carry, if it was renamed.
            pub const fn former_name(self) -> Option<&'static str> {
                match self { $(EventType::$variant => catalogue!(@former $($old)?),)+ }
            }

            /// Who writes it.
            pub const fn source(self) -> Source {
                match self { $(EventType::$variant => Source::$source,)+ }
            }

            /// When it is written, in an auditor's words.
            pub fn when(self) -> String {
                let lines: &[&str] = match self { $(EventType::$variant => &[$($when),+],)+ };
                lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join(" ")
            }

            /// The event's own fields (besides [`COMMON_FIELDS`]).
            pub const fn fields(self) -> &'static [Field] {
                match self {
                    $(EventType::$variant => &[$(Field { name: $field, doc: $fdoc }),*],)+
                }
            }
        }
    };
    (@former) => { None };
    (@former $old:literal) => { Some($old) };
}

/// The fields `auth/src/failures.rs` writes into every failure it aggregates (`auth.fail`,
/// and unsuccessful `user.login` and `node.join`), per (door, address, reason) a minute.
pub const FAILURE_FIELDS: &[&str] = &["door", "reason", "count"];

catalogue! {
    /// An admin created a user (`sallyctl users add`); a sign-up token was issued with it.
    /// `user` is the admin.
    UserCreate = "user.create", by Auth {
        "name": "the new user",
        "roles": "the roles given",
        "logins": "the logins given",
    }
    /// An admin changed a user's roles or logins (`sallyctl users update`). `user` is the admin.
    UserUpdate = "user.update", by Auth {
        "name": "the user changed",
        "roles": "the user's roles now",
        "logins": "the user's logins now",
    }
    /// An admin removed a user (`sallyctl users rm` or `sallyctl rm user/NAME`). `user` is the admin.
    UserDelete = "user.delete", by Auth {
        "name": "the user removed",
    }
    /// An admin cleared a local user's password and second factor (`sallyctl users reset`); a
    /// new sign-up token was issued. `user` is the admin.
    UserReset = "user.reset", by Auth {
        "name": "the user reset",
    }
    /// A person finished sign-up with a token (`sally signup`): password and second factor set.
    /// `user` is the person.
    UserSignup = "user.signup", by Auth {
        "remote_addr": "the client's address",
    }
    /// A login, successful or not: with a password and one-time code (`method: local`, or
    /// `method: web` when it opens a browser's web session) or through an SSO connector
    /// (`method: oidc`). `user` is who logged in, or the name a failed
    /// login asked for. Failures are aggregated per (address, reason, existing user) a minute.
    UserLogin = "user.login", by Auth {
        "success": "whether certificates were issued",
        "method": "`local`, `web` (a browser's web session) or `oidc`",
        "remote_addr": "the client's address (as the proxy saw it)",
        "roles": "success: the roles in the certificates",
        "valid_until": "success, local and web: when the certificates expire",
        "connector": "oidc: the connector's name",
        "claims": "oidc success: the claims that matched a role mapping, as `{claim, value}`",
        "error": "failure: the answer the client got",
        "door": "failure: `api`",
        "reason": "failure: what was wrong (only the audit log says which part)",
        "count": "failure: how many failures this record stands for",
    }
    /// An SSO user from before identities were stored was bound to the identity that logged
    /// in as it. `user` is that user.
    UserSsoLink = "user.sso_link", was "user.sso_linked", by Auth {
        "connector": "the connector",
        "issuer": "the provider's issuer URL",
        "subject": "the identity's `sub` at that issuer",
    }
    /// An admin created a role (`sallyctl create`). `user` is the admin.
    RoleCreate = "role.create", was "role.created", by Auth {
        "name": "the role",
    }
    /// An admin replaced a role (`sallyctl create --force`). `user` is the admin.
    RoleUpdate = "role.update", was "role.updated", by Auth {
        "name": "the role",
    }
    /// An admin removed a role (`sallyctl rm role/NAME`). `user` is the admin.
    RoleDelete = "role.delete", was "role.deleted", by Auth {
        "name": "the role",
    }
    /// An admin created an SSO connector (`sallyctl create` of `kind: oidc`). `user` is the
    /// admin.
    ConnectorCreate = "connector.create", was "connector.created", by Auth {
        "connector": "the connector's name",
        "issuer_url": "the provider it trusts",
    }
    /// An admin replaced an SSO connector (`sallyctl create --force`). `user` is the admin.
    ConnectorUpdate = "connector.update", was "connector.updated", by Auth {
        "connector": "the connector's name",
        "issuer_url": "the provider it trusts now",
    }
    /// An admin removed an SSO connector (`sallyctl rm oidc/NAME`). `user` is the admin.
    ConnectorDelete = "connector.delete", was "connector.deleted", by Auth {
        "connector": "the connector's name",
    }
    /// An admin locked a user (`sallyctl lock`): logins, sessions and API calls are refused
    /// and live connections end. `user` is the admin.
    LockCreate = "lock.create", was "lock.created", by Auth {
        "lock_id": "the lock's id",
        "target_user": "the user locked",
        "message": "what the locked user is told",
        "expires": "RFC 3339, or null: until removed",
    }
    /// An admin lifted a lock (`sallyctl rm lock/ID`). `user` is the admin.
    LockDelete = "lock.delete", was "lock.deleted", by Auth {
        "lock_id": "the lock's id",
    }
    /// An admin created a join token (`sallyctl tokens add`). `user` is the admin.
    TokenCreate = "token.create", by Auth {
        "type": "what it joins: `node`",
        "expires": "RFC 3339",
    }
    /// An admin registered an agentless node (`sallyctl nodes add`). `user` is the admin.
    NodeCreate = "node.create", by Auth {
        "name": "the node's name",
        "addr": "its SSH address",
    }
    /// An admin removed a node (`sallyctl nodes rm` or `sallyctl rm node/NAME`). `user` is the admin.
    NodeDelete = "node.delete", by Auth {
        "name": "the node's name or id, as given",
    }
    /// An agent joined with a token, or was refused (aggregated per address and reason a
    /// minute). `user` is null.
    NodeJoin = "node.join", by Auth {
        "success": "whether it joined",
        "node_id": "success: the id given to the node",
        "kind": "success: `agent` for a node, `kube` for a Kubernetes cluster's agent",
        "nodename": "the name the agent asked for (clipped when refused)",
        "labels": "success: the labels it joined with",
        "remote_addr": "the agent's address",
        "error": "failure: the answer the agent got",
        "door": "failure: `join`",
        "reason": "failure: why",
        "count": "failure: how many failures this record stands for",
    }
    /// An agent's certificates were renewed, asked through the proxy its tunnel is to.
    /// `user` is null.
    NodeRenew = "node.renew", by Auth {
        "node_id": "the node",
        "nodename": "its name",
        "proxy": "the proxy that asked for it (the one holding its tunnel)",
    }
    /// A proxy service joined with a `proxy` token, or was refused (aggregated per address and
    /// reason a minute). `user` is null.
    ProxyJoin = "proxy.join", by Auth {
        "success": "whether it joined",
        "proxy_id": "success: the id given to the proxy (its certificate's CN)",
        "name": "the name the proxy asked for (clipped when refused)",
        "remote_addr": "the proxy's address",
        "error": "failure: the answer the proxy got",
        "door": "failure: `join`",
        "reason": "failure: why",
        "count": "failure: how many failures this record stands for",
    }
    /// An admin removed a proxy (`sallyctl proxies rm`): its certificate is refused from now
    /// on. `user` is the admin.
    ProxyDelete = "proxy.delete", by Auth {
        "name": "the proxy's name or id, as given",
    }
    /// Auth refused a session (`POST /v1/sessions`): no such user, locked, roles deny,
    /// `max_sessions` or `max_connections` reached, node unknown. `user` is the person.
    SessionReject = "session.reject", was "session.rejected", by Auth {
        "login": "the login asked for",
        "node": "the node asked for",
        "reason": "why, as the person was told",
        "remote_addr": "the person's address",
        "kube_cluster": "kubectl exec/attach: the cluster",
        "namespace": "kubectl exec/attach: the pod's namespace",
        "pod": "kubectl exec/attach: the pod",
    }
    /// Auth granted a session: a per-session certificate was issued for the login on the node.
    /// `user` is the person.
    SessionStart = "session.start", by Auth {
        "session_id": "the session (its recording is `<session_id>.cast`)",
        "login": "the login on the node",
        "node": "the node's name",
        "node_id": "the node's id",
        "remote_addr": "the person's address",
        "explanation": "which roles allowed it",
        "kube_cluster": "kubectl exec/attach: the cluster (`node` too)",
        "namespace": "kubectl exec/attach: the pod's namespace",
        "pod": "kubectl exec/attach: the pod",
        "container": "kubectl exec/attach: the container (empty: the pod's default)",
        "command": "kubectl exec: the command; attach: `attach NAMESPACE/POD`",
        "tty": "kubectl exec/attach: whether a terminal was asked for",
        "protocol": "kubectl exec/attach: the client's stream protocol (`v5.channel.k8s.io`, ...)",
        "kube_users": "kubectl exec/attach: the user impersonated (also `login`)",
        "kube_groups": "kubectl exec/attach: the groups impersonated",
    }
    /// A session ended (the proxy's report). `user` is the person.
    SessionEnd = "session.end", by Auth {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "exit_code": "the command's or shell's exit status, or null",
        "bytes_in": "bytes the person sent",
        "bytes_out": "bytes the node sent",
        "duration_secs": "seconds from start to end",
        "status": "`complete`, or `incomplete` when the recording could not be finished",
    }
    /// A session that ran a command ended (written just before its `session.end`). `user` is
    /// the person.
    Exec = "exec", by Auth {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "command": "the command as the client sent it",
        "exit_code": "its exit status, or null",
    }
    /// A failed authentication at a door other than login: a proxy's SSH or tunnel door
    /// (reported by the proxy) or auth's API (a refused client certificate, a refused sign-up
    /// token). Aggregated per (door, address, reason) a minute: the first at once, the rest in
    /// one record with their `count`. `user` is the name the client asked for, if any.
    AuthFail = "auth.fail", was "auth.failed", by Auth {
        "door": "`ssh`, `tunnel` or `api`",
        "remote_addr": "the client's address",
        "reason": "why, in words an admin can act on",
        "count": "how many failures this record stands for",
        "presented": "what the client presented (key or certificate fingerprints, certificate names), the first in the window",
        "presented_all": "aggregated: the distinct identities presented in the window, at most 16, in the order first seen",
        "presented_unlisted": "aggregated: distinct identities beyond those 16",
        "path": "`api` door: the request path",
    }
    /// An SFTP operation in a session, or an SFTP channel refused (`ssh_file_copy: false`) or
    /// ended because it could no longer be audited (`action: abort`), or its error output cut
    /// (`action: stderr`). `user` is the person.
    Sftp = "sftp", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "action": "`open`, `remove`, `rename`, `mkdir`, `rmdir`, `symlink`, `hardlink`, `setstat`, `extended`; `start` (refused), `abort`, or `stderr` (error output past 64 KiB dropped; the channel goes on)",
        "path": "the file",
        "target": "`rename`, `symlink`, `hardlink`: the second path",
        "mode": "`open`: `read`, `write` or `read-write`",
        "bytes": "`open`: bytes read plus written through the handle",
        "extension": "`extended`: the extension's name",
        "result": "`ok`, the server's error, `incomplete`, or why it was refused or aborted",
    }
    /// A file copied with `scp` (legacy protocol) or `rsync`, or a copy command refused or
    /// ended, or its error output cut (`result` says so; the copy goes on). `user` is the person.
    Scp = "scp", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "tool": "`scp` or `rsync`",
        "direction": "`upload` or `download`",
        "path": "the path the command named",
        "file": "scp: the file's name",
        "size": "the file's size (rsync: bytes transferred)",
        "exit_code": "rsync: its exit status",
        "command": "a refused command, as sent",
        "result": "why it was refused or ended",
    }
    /// A forwarded TCP connection (`ssh -L`/`-D`: `kind: local`; `-R`: `kind: remote`) ended,
    /// or was refused because the roles no longer allow it. `user` is the person.
    Port = "port", by Proxy {
        "session_id": "the forwarding connection's session",
        "login": "the login on the node",
        "node": "the node's name",
        "kind": "`local` or `remote`",
        "addr": "the forwarded address, `host:port`",
        "originator": "the other end, `host:port`",
        "bytes_in": "bytes toward the node",
        "bytes_out": "bytes from the node",
        "result": "why it was refused",
    }
    /// X11 forwarding was asked for on a session, or an X11 channel the node opened was
    /// refused. `user` is the person.
    X11Forward = "x11-forward", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "screen": "the X11 screen number",
        "result": "`ok`, or why it was refused",
        "channel": "`refused` for a refused channel",
    }
    /// Agent forwarding was asked for on a session, or an agent channel the node opened was
    /// refused. `user` is the person.
    AgentForward = "agent-forward", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "result": "`ok`, or why it was refused",
        "channel": "`refused` for a refused channel",
    }
    /// A session's recording reached `max_recording_size`: a `strict` session ended, a
    /// `best_effort` one went on unrecorded. `user` is the person.
    SessionRecordingLimit = "session.recording_limit", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "max_recording_size": "the limit, in bytes",
        "record_session": "`strict` or `best_effort`",
        "action": "`session ended` or `recording stopped`",
    }
    /// A session's recording could not be created or written (a full disk, an I/O error): a
    /// `strict` session ended (or was refused), a `best_effort` one went on unrecorded; the
    /// session's `session.end` says `incomplete`. `user` is the person.
    SessionRecordingFail = "session.recording_fail", by Proxy {
        "session_id": "the session",
        "login": "the login on the node",
        "node": "the node's name",
        "error": "what failed, as the system said it",
        "record_session": "`strict` or `best_effort`",
        "action": "`session ended` or `recording stopped`",
    }
    /// An agent created the session's login on its node (roles' `create_host_user_mode`).
    /// `user` is the person.
    HostUserCreate = "host_user.create", by Agent {
        "session_id": "the session",
        "login": "the login created",
        "node": "the node's name",
        "mode": "`keep` or `insecure-drop`",
        "groups": "the groups it was given",
        "sudoers": "the sudoers lines it was given",
        "sudoers_file": "the sudoers drop-in written, if any",
    }
    /// A Kubernetes request through the proxy's kube door (3026), allowed or refused: the
    /// proxy decides it and reports it in batches (`POST /v1/kube/requests`), auth writes it.
    /// `user` is the person.
    KubeRequest = "kube.request", by Auth {
        "kube_cluster": "the cluster",
        "method": "the HTTP method",
        "path": "the path the API server sees (without `/kube/CLUSTER`)",
        "verb": "the Kubernetes verb the roles decided on (`get`, `list`, `watch`, `exec`, ...)",
        "kind": "the kind (`pod`), or the resource for one outside the roles' vocabulary; empty for discovery",
        "namespace": "the namespace, if any",
        "name": "the object's name, if any",
        "response_code": "the HTTP status the person got",
        "allowed": "whether the proxy let it through",
        "reason": "why, in the roles' words",
        "kube_users": "the user impersonated",
        "kube_groups": "the groups impersonated",
        "kubectl_command": "kubectl's `Kubectl-Command` header, when sent",
        "remote_addr": "the person's address",
    }
    /// A `kubectl port-forward` stream through the kube door began (`action: start`) or ended
    /// (`stop`); the forwarded bytes are not recorded. `user` is the person.
    KubePortForward = "kube.port_forward", by Auth {
        "action": "`start` or `stop`",
        "kube_cluster": "the cluster",
        "namespace": "the pod's namespace",
        "pod": "the pod",
        "ports": "the pod's ports: start, those the request's URL names; stop, those too and every port kubectl's streams reached (it names them inside SPDY, plain or in WebSocket)",
        "kube_users": "the user impersonated",
        "kube_groups": "the groups impersonated",
        "remote_addr": "the person's address",
        "duration_secs": "stop: how long it lasted",
        "reason": "stop: why the proxy ended it (a lock, an expired certificate), if it did",
    }
}

impl EventType {
    /// The event named `name` in the log today.
    pub fn from_name(name: &str) -> Option<EventType> {
        Self::ALL.iter().copied().find(|t| t.name() == name)
    }

    /// The event named `name` today or before the catalogue renamed it: what a search for
    /// `name` must find.
    pub fn find(name: &str) -> Option<EventType> {
        Self::ALL
            .iter()
            .copied()
            .find(|t| t.name() == name || t.former_name() == Some(name))
    }

    /// Whether records of this event carry `field` (its own or a common one).
    pub fn has_field(self, field: &str) -> bool {
        self.fields().iter().any(|f| f.name == field)
            || COMMON_FIELDS.iter().any(|f| f.name == field)
    }
}

impl std::fmt::Display for EventType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Why a name is not an event type, with the names that are.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{name:?} is not an audit event type; the types are: {}", EventType::ALL.iter().map(|t| t.name()).collect::<Vec<_>>().join(", "))]
pub struct UnknownEventType {
    pub name: String,
}

impl std::str::FromStr for EventType {
    type Err = UnknownEventType;

    /// Today's names only: what is written and reported. Searches use [`EventType::find`].
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::from_name(name).ok_or_else(|| UnknownEventType { name: name.into() })
    }
}

impl Serialize for EventType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl<'de> Deserialize<'de> for EventType {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let name = std::borrow::Cow::<str>::deserialize(d)?;
        name.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests;
