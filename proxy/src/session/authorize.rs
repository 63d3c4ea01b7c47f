//! The grant: auth decides each session with the user's current roles (logins, labels, deny
//! rules, locks, `max_sessions`, `max_connections`) and certifies the proxy's key for exactly
//! this login (`POST /v1/sessions`); a grant is checked again before each new thing it carries
//! long after it was given ([`GrantRecheck`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sallyport_core::api::{
    GrantCheck, NodeInfo, RefusalCode, SessionEnd, SessionGrant, SessionRequest, SessionStatus,
};

use super::Refusal;
use crate::auth_client::ClientError;
use crate::state::{OpenConnection, ProxyState};

/// Who wants a session where, as the door established it.
#[derive(Debug, Clone)]
pub struct Target {
    pub user: String,
    pub login: String,
    pub node: NodeInfo,
    /// The person's address, as the door saw it.
    pub addr: SocketAddr,
    /// When the person's credential expires (Unix seconds), for `disconnect_expired_cert`.
    pub cert_expires: u64,
    /// Sessions already open on the person's connection (`max_sessions`); `None` for a kind
    /// of session the limit does not count (forwarding).
    pub open_sessions: Option<u32>,
    /// The person's connection the session runs on, counted among the user's open ones on
    /// this proxy (`max_connections`: the older ones still open are counted when the grant is
    /// asked for); auth registers it when a role sets the limit, for the other proxies' counts.
    pub connection: Option<Arc<OpenConnection>>,
    /// Set when the person's credential is genuine but does not cover the login: auth is still
    /// asked (it audits the refusal with the roles' explanation) and the session refused with
    /// these words, the door's own remedy in them.
    pub credential_refusal: Option<String>,
    /// A `kubectl exec` or `attach` (the node is then a Kubernetes cluster).
    pub kube: Option<sallyport_core::kube::KubeExec>,
    /// The door the person came through, for the metrics.
    pub door: sallyport_core::metrics::SessionDoor,
}

/// Asks auth for a session for `target`.
pub async fn grant(state: &ProxyState, target: &Target) -> Result<SessionGrant, Refusal> {
    let (connection, older_connections) = match &target.connection {
        Some(c) => {
            let (reference, older) = c.reference();
            (Some(reference), older)
        }
        None => (None, 0),
    };
    let req = SessionRequest {
        user: target.user.clone(),
        login: target.login.clone(),
        node: target.node.id.clone(),
        public_key: state.public_key()?,
        remote_addr: target.addr.to_string(),
        open_sessions: target.open_sessions,
        older_connections,
        kube: target.kube.clone(),
        connection,
    };
    // Asked on a task of its own, holding the connection: a door that stops waiting (kubectl
    // gone mid-request) cannot lose auth's answer, and with it a registration to undo.
    let auth = state.auth.clone();
    let connection = target.connection.clone();
    let asking = tokio::spawn(async move {
        let answer: Result<SessionGrant, ClientError> = auth
            .json(
                reqwest::Method::POST,
                sallyport_core::routes::auth::SESSIONS,
                Some(&req),
            )
            .await;
        if let Some(c) = &connection {
            match &answer {
                Ok(g) if g.connection_registered => c.registered(),
                // Refused as asked: auth registers nothing it refuses.
                Ok(_)
                | Err(ClientError::Refused {
                    status: 400..=499, ..
                }) => {}
                // Auth may have registered it before failing: it is said to close all the same
                // (for a connection auth does not hold, that changes nothing).
                Err(_) => c.maybe_registered(),
            }
        }
        answer
    });
    let grant = asking
        .await
        .map_err(|e| Refusal::Failed(format!("the grant was not asked: {e}")))?
        .map_err(refusal)?;
    if let Some(why) = &target.credential_refusal {
        super::audit::end_now(state, &grant.session_id, failed_end()).await;
        // The door's words, with its own remedy (`sally login`, or signing in again).
        return Err(Refusal::Denied {
            explanation: why.clone(),
        });
    }
    Ok(grant)
}

/// The end of a session that never ran.
pub fn failed_end() -> SessionEnd {
    SessionEnd {
        status: SessionStatus::Complete,
        exit_code: Some(255),
        ..Default::default()
    }
}

/// Auth's refusal of a grant, by the kind auth gives it on the wire (`ErrorBody::code`).
fn refusal(e: ClientError) -> Refusal {
    match e {
        ClientError::Refused {
            status: 403,
            message,
            code,
        } => match code {
            Some(RefusalCode::Limit) => Refusal::Limit(message),
            Some(RefusalCode::Locked) => Refusal::Locked(message),
            Some(RefusalCode::Denied) | None => Refusal::Denied {
                explanation: message,
            },
        },
        e => Refusal::Failed(e.to_string()),
    }
}

pub const PORT_FORWARDING_REFUSED: &str =
    "port forwarding is not allowed by your roles (port_forwarding)";
pub const AGENT_FORWARDING_REFUSED: &str =
    "agent forwarding is not allowed by your roles (forward_agent)";
pub const X11_FORWARDING_REFUSED: &str =
    "X11 forwarding is not allowed by your roles (permit_x11_forwarding)";

/// How long a grant, checked again with auth, is trusted: a user removed, locked or without
/// `port_forwarding` any more gets no new forwarded connection after this.
const GRANT_RECHECK: Duration = Duration::from_secs(2);

/// A session's grant, checked again, at most every [`GRANT_RECHECK`], before each new thing
/// it carries long after it was given: on the forwarding connection, each new connection
/// through a forward (`-L`, `-D`, `-R`) and each new `-R` bind; on a session, each agent or
/// X11 channel the node opens toward the person.
pub struct GrantRecheck {
    state: Arc<ProxyState>,
    pub session_id: String,
    last: tokio::sync::Mutex<Option<(Instant, Result<GrantCheck, String>)>>,
}

impl GrantRecheck {
    /// Starts from `grant`, just given.
    pub fn new(state: Arc<ProxyState>, grant: &SessionGrant) -> Self {
        let answer = GrantCheck {
            port_forwarding: grant.port_forwarding,
            forward_agent: grant.forward_agent,
            x11_forwarding: grant.x11_forwarding,
        };
        GrantRecheck {
            state,
            session_id: grant.session_id.clone(),
            last: tokio::sync::Mutex::new(Some((Instant::now(), Ok(answer)))),
        }
    }

    /// Whether the user's current roles and locks still allow a new forwarded connection.
    pub async fn allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.port_forwarding => Ok(()),
            _ => Err(PORT_FORWARDING_REFUSED.to_string()),
        }
    }

    /// Whether they still allow the node a new agent channel.
    pub async fn agent_allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.forward_agent => Ok(()),
            _ => Err(AGENT_FORWARDING_REFUSED.to_string()),
        }
    }

    /// Whether they still allow the node a new X11 channel.
    pub async fn x11_allowed(&self) -> Result<(), String> {
        match self.current().await? {
            g if g.x11_forwarding => Ok(()),
            _ => Err(X11_FORWARDING_REFUSED.to_string()),
        }
    }

    /// What the user's current roles and locks allow, as auth answers now (or answered less
    /// than [`GRANT_RECHECK`] ago). When auth cannot be asked the answer is an error: nothing
    /// is worth an unchecked grant.
    async fn current(&self) -> Result<GrantCheck, String> {
        let mut last = self.last.lock().await;
        if let Some((at, answer)) = &*last
            && at.elapsed() < GRANT_RECHECK
        {
            return answer.clone();
        }
        let path = sallyport_core::routes::auth::session_check(&self.session_id);
        let answer = match self
            .state
            .auth
            .json::<_, GrantCheck>(reqwest::Method::POST, &path, Some(&serde_json::json!({})))
            .await
        {
            Ok(g) => Ok(g),
            Err(e) => Err(e.to_string()),
        };
        *last = Some((Instant::now(), answer.clone()));
        answer
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sallyport_core::api::ErrorBody;

    #[test]
    fn auth_refusals_are_told_apart_by_their_code_not_their_text() {
        // The bodies as auth's `AuthError` writes them (`access denied: ...`).
        let r = |status, body: &str| {
            let b: ErrorBody = serde_json::from_str(body).unwrap_or_else(|e| panic!("{e}"));
            refusal(ClientError::Refused {
                status,
                message: b.error,
                code: b.code,
            })
        };
        assert!(matches!(
            r(
                403,
                r#"{"error":"access denied: alice has 2 other connections open, the most your roles allow (max_connections: 2)","code":"limit"}"#
            ),
            Refusal::Limit(_)
        ));
        assert!(matches!(
            r(
                403,
                r#"{"error":"access denied: user alice is locked: incident 42","code":"locked"}"#
            ),
            Refusal::Locked(_)
        ));
        // A message that merely reads like a lock is what its code says.
        assert!(matches!(
            r(
                403,
                r#"{"error":"access denied: user alice is locked: no","code":"denied"}"#
            ),
            Refusal::Denied { .. }
        ));
        // An older auth without codes: every 403 is a denial.
        assert!(matches!(
            r(
                403,
                r#"{"error":"access denied: login root is not allowed on web1"}"#
            ),
            Refusal::Denied { .. }
        ));
        assert!(matches!(r(500, r#"{"error":"boom"}"#), Refusal::Failed(_)));
    }
}
