//! Every HTTP path Sallyport serves, in one table: the auth API (mutual TLS, 3025) in [`auth`]
//! and the proxy's web API (3080) in [`web`].
//!
//! Each route has a pattern constant in axum's syntax (`/v1/users/{name}`), which the servers
//! route on, and — when it has a parameter — a function that builds the concrete path for a
//! client, every parameter one percent-encoded segment ([`path_segment`]), so a name such as
//! `../oidc/callback#` reaches no other route. Clients never write a path by hand.
//!
//! [`AUTH`] and [`WEB`] list every (method, pattern) each server answers: auth's router is built
//! from its list and its authorization test walks it, so a route cannot be added to one without
//! the other. What must never be here: anything but paths (bodies are `crate::api`).

use crate::api::path_segment;

/// An HTTP method a route answers (only the ones Sallyport uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Method {
    Get,
    Post,
    Put,
    Delete,
}

impl Method {
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }
}

impl std::fmt::Display for Method {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One method on one path pattern.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Route {
    pub method: Method,
    pub pattern: &'static str,
}

const fn r(method: Method, pattern: &'static str) -> Route {
    Route { method, pattern }
}

/// The auth API's paths (mutual TLS on 3025; `sallyctl` as a user reaches it through the proxy's
/// ALPN passthrough).
pub mod auth {
    use super::path_segment;

    pub const PING: &str = "/v1/ping";
    pub const STATUS: &str = "/v1/status";

    pub const SIGNUP_START: &str = "/v1/signup/start";
    pub const SIGNUP_FINISH: &str = "/v1/signup/finish";
    pub const LOGIN: &str = "/v1/login";

    pub const OIDC_START: &str = "/v1/oidc/start";
    pub const OIDC_CALLBACK: &str = "/v1/oidc/callback";
    pub const OIDC_FINISH: &str = "/v1/oidc/finish";

    pub const USERS: &str = "/v1/users";
    pub const USER: &str = "/v1/users/{name}";
    pub const USER_RESET: &str = "/v1/users/{name}/reset";

    pub const CA: &str = "/v1/ca/{kind}";

    pub const AUDIT: &str = "/v1/audit";
    pub const AUDIT_VERIFY: &str = "/v1/audit/verify";

    pub const ROLES: &str = "/v1/roles";
    pub const ROLE: &str = "/v1/roles/{name}";
    pub const ACCESS_CHECK: &str = "/v1/access/check";

    pub const CONNECTORS: &str = "/v1/connectors";
    pub const CONNECTOR: &str = "/v1/connectors/{name}";

    pub const TOKENS: &str = "/v1/tokens";
    pub const JOIN_TOKENS: &str = "/v1/tokens/join";
    pub const JOIN: &str = "/v1/join";

    pub const PROXIES: &str = "/v1/proxies";
    pub const PROXY: &str = "/v1/proxies/{name}";
    pub const PROXY_JOIN: &str = "/v1/proxies/join";
    pub const PROXY_HEARTBEAT: &str = "/v1/proxies/{name}/heartbeat";
    pub const PROXY_RENEW: &str = "/v1/proxies/{name}/renew";
    pub const PROXY_PRESENCE: &str = "/v1/proxies/{name}/presence";

    pub const NODES: &str = "/v1/nodes";
    pub const NODE: &str = "/v1/nodes/{name}";
    pub const NODE_PRESENCE: &str = "/v1/nodes/{name}/presence";
    pub const NODE_PROXY_HOST_CERT: &str = "/v1/nodes/{name}/proxy-host-cert";
    pub const NODE_HOST_KEY: &str = "/v1/nodes/{name}/host-key";
    pub const NODE_RENEW: &str = "/v1/nodes/{name}/renew";

    pub const SESSIONS: &str = "/v1/sessions";
    /// A proxy's registered connections that closed (`max_connections` across proxies).
    pub const CONNECTIONS_CLOSED: &str = "/v1/connections/closed";
    /// One session's record and its recording's size, for whom may replay it.
    pub const SESSION: &str = "/v1/sessions/{id}";
    pub const SESSION_END: &str = "/v1/sessions/{id}/end";
    pub const SESSION_CHECK: &str = "/v1/sessions/{id}/check";
    pub const SESSION_UPDATE: &str = "/v1/sessions/{id}/update";
    pub const SESSION_EVENTS: &str = "/v1/sessions/{id}/events";
    pub const SESSION_RECORDING: &str = "/v1/sessions/{id}/recording";

    pub const LOCKS: &str = "/v1/locks";
    pub const LOCK: &str = "/v1/locks/{id}";

    pub const AUTH_FAILURES: &str = "/v1/auth-failures";

    /// Browsers' web sessions, kept for every proxy (proxies only): a new one, one looked up,
    /// its input, its end, and which of a set still exist.
    pub const WEB_SESSIONS: &str = "/v1/web-sessions";
    pub const WEB_SESSION: &str = "/v1/web-sessions/{hash}";
    pub const WEB_SESSION_TOUCH: &str = "/v1/web-sessions/{hash}/touch";
    pub const WEB_SESSION_END: &str = "/v1/web-sessions/{hash}/end";
    pub const WEB_SESSIONS_CHECK: &str = "/v1/web-sessions/check";
    /// Browsers' SSO sign-ins waiting for the browser to come back (proxies only): put, read
    /// (left in place), removed once it opened its session.
    pub const WEB_SSO: &str = "/v1/web-sso";
    pub const WEB_SSO_ONE: &str = "/v1/web-sso/{hash}";

    pub const KUBE_CLUSTERS: &str = "/v1/kube/clusters";
    pub const KUBE_CERTS: &str = "/v1/kube/certs";
    pub const KUBE_ACCESS: &str = "/v1/kube/access";
    pub const KUBE_REQUESTS: &str = "/v1/kube/requests";

    /// `pattern` with its one `{parameter}` replaced by `value` as one percent-encoded segment.
    fn fill(pattern: &str, value: &str) -> String {
        match (pattern.find('{'), pattern.find('}')) {
            (Some(open), Some(close)) if open < close => format!(
                "{}{}{}",
                &pattern[..open],
                path_segment(value),
                &pattern[close + 1..]
            ),
            _ => pattern.to_string(),
        }
    }

    pub fn user(name: &str) -> String {
        fill(USER, name)
    }
    pub fn user_reset(name: &str) -> String {
        fill(USER_RESET, name)
    }
    /// `kind`: user, host, openssh, tls-user or tls-host.
    pub fn ca(kind: &str) -> String {
        fill(CA, kind)
    }
    pub fn role(name: &str) -> String {
        fill(ROLE, name)
    }
    pub fn connector(name: &str) -> String {
        fill(CONNECTOR, name)
    }
    pub fn node(name: &str) -> String {
        fill(NODE, name)
    }
    pub fn proxy(name: &str) -> String {
        fill(PROXY, name)
    }
    pub fn proxy_heartbeat(name: &str) -> String {
        fill(PROXY_HEARTBEAT, name)
    }
    pub fn proxy_renew(name: &str) -> String {
        fill(PROXY_RENEW, name)
    }
    pub fn proxy_presence(name: &str) -> String {
        fill(PROXY_PRESENCE, name)
    }
    pub fn node_renew(name: &str) -> String {
        fill(NODE_RENEW, name)
    }
    pub fn node_presence(name: &str) -> String {
        fill(NODE_PRESENCE, name)
    }
    pub fn node_proxy_host_cert(name: &str) -> String {
        fill(NODE_PROXY_HOST_CERT, name)
    }
    pub fn node_host_key(name: &str) -> String {
        fill(NODE_HOST_KEY, name)
    }
    pub fn session(id: &str) -> String {
        fill(SESSION, id)
    }
    pub fn session_end(id: &str) -> String {
        fill(SESSION_END, id)
    }
    pub fn session_check(id: &str) -> String {
        fill(SESSION_CHECK, id)
    }
    pub fn session_update(id: &str) -> String {
        fill(SESSION_UPDATE, id)
    }
    pub fn session_events(id: &str) -> String {
        fill(SESSION_EVENTS, id)
    }
    pub fn session_recording(id: &str) -> String {
        fill(SESSION_RECORDING, id)
    }
    pub fn lock(id: &str) -> String {
        fill(LOCK, id)
    }
    pub fn web_session(hash: &str) -> String {
        fill(WEB_SESSION, hash)
    }
    pub fn web_session_touch(hash: &str) -> String {
        fill(WEB_SESSION_TOUCH, hash)
    }
    pub fn web_session_end(hash: &str) -> String {
        fill(WEB_SESSION_END, hash)
    }
    pub fn web_sso(hash: &str) -> String {
        fill(WEB_SSO_ONE, hash)
    }
}

/// The proxy's web API (HTTPS on 3080): what people and agents reach before they hold a
/// certificate, each forwarded to one auth route (but ping and the OIDC callback), and the
/// browser's web session (`WEB_*`, `NODES`, `TERMINAL`: the session cookie, answered by the proxy
/// calling auth as the session's own certificate).
pub mod web {
    pub const PING: &str = "/v1/webapi/ping";
    pub const JOIN: &str = "/v1/webapi/join";
    pub const SIGNUP_START: &str = "/v1/webapi/signup/start";
    pub const SIGNUP_FINISH: &str = "/v1/webapi/signup/finish";
    pub const LOGIN: &str = "/v1/webapi/login";
    pub const OIDC_LOGIN_START: &str = "/v1/webapi/oidc/login/start";
    /// Where the identity provider sends the browser back (`crate::oidc::CALLBACK_PATH`).
    pub const OIDC_CALLBACK: &str = "/v1/webapi/oidc/callback";
    pub const OIDC_LOGIN_FINISH: &str = "/v1/webapi/oidc/login/finish";
    /// A browser's SSO sign-in: the link of the sign-in page's button for a connector
    /// (`?connector=NAME`), and the same-site page the callback sends the browser on to, which
    /// opens the web session and moves on to the servers page.
    pub const OIDC_WEB_START: &str = "/v1/webapi/oidc/web/start";
    pub const OIDC_WEB_FINISH: &str = "/v1/webapi/oidc/web/finish";
    /// A browser signs in (`POST`), reads its session and CSRF token (`GET`), signs out
    /// (`DELETE` of [`WEB_SESSION`]).
    pub const WEB_LOGIN: &str = "/v1/webapi/web/login";
    pub const WEB_SESSION: &str = "/v1/webapi/web/session";
    /// The nodes the signed-in user's roles reach, with the logins allowed on each.
    pub const NODES: &str = "/v1/webapi/nodes";
    /// The browser terminal's WebSocket (`?node=N&login=L&cols=C&rows=R`).
    pub const TERMINAL: &str = "/v1/webapi/terminal";
    /// The sessions the user may replay (`sally recordings ls`'s scope), one's record with its
    /// recording's size, and its asciicast, streamed.
    pub const RECORDINGS: &str = "/v1/webapi/recordings";
    pub const RECORDING: &str = "/v1/webapi/recordings/{id}";
    pub const RECORDING_CAST: &str = "/v1/webapi/recordings/{id}/cast";
    /// The audit log, a page at a time (`?type=&user=&node=&session=&since=&until=&limit=&cursor=`),
    /// and the whole filtered range as `sallyctl audit search` prints it.
    pub const AUDIT: &str = "/v1/webapi/audit";
    pub const AUDIT_DOWNLOAD: &str = "/v1/webapi/audit/download";
    /// The role editor: the list, one role as YAML with its revision (`GET`), saved over that
    /// revision (`PUT`) or deleted, and a text checked with each problem's line and column.
    pub const ROLES: &str = "/v1/webapi/roles";
    pub const ROLE: &str = "/v1/webapi/roles/{name}";
    pub const ROLES_VALIDATE: &str = "/v1/webapi/roles/validate";
    /// Admin: users with their locks (`GET`), a new user (`POST`: the sign-up link, once), a
    /// reset; a lock (`POST`), lifted (`DELETE` of [`LOCK`]); join tokens, a new one with the
    /// agent's command, once.
    pub const USERS: &str = "/v1/webapi/users";
    pub const USER_RESET: &str = "/v1/webapi/users/{name}/reset";
    pub const LOCKS: &str = "/v1/webapi/locks";
    pub const LOCK: &str = "/v1/webapi/locks/{id}";
    pub const TOKENS: &str = "/v1/webapi/tokens";
    /// Every path of the web API starts here; an unknown one is a JSON 404.
    pub const PREFIX: &str = "/v1/webapi/";
}

use Method::{Delete, Get, Post, Put};

/// Every route the auth API answers. `sallyport_auth::api::router` is built from exactly this
/// list, and the authorization test has a row for each.
pub const AUTH: &[Route] = &[
    r(Get, auth::PING),
    r(Get, auth::STATUS),
    r(Post, auth::SIGNUP_START),
    r(Post, auth::SIGNUP_FINISH),
    r(Post, auth::LOGIN),
    r(Post, auth::OIDC_START),
    r(Post, auth::OIDC_CALLBACK),
    r(Post, auth::OIDC_FINISH),
    r(Get, auth::USERS),
    r(Post, auth::USERS),
    r(Get, auth::USER),
    r(Put, auth::USER),
    r(Delete, auth::USER),
    r(Post, auth::USER_RESET),
    r(Get, auth::CA),
    r(Get, auth::AUDIT),
    r(Get, auth::AUDIT_VERIFY),
    r(Get, auth::ROLES),
    r(Post, auth::ROLES),
    r(Get, auth::ROLE),
    r(Delete, auth::ROLE),
    r(Post, auth::ACCESS_CHECK),
    r(Get, auth::CONNECTORS),
    r(Post, auth::CONNECTORS),
    r(Delete, auth::CONNECTOR),
    r(Get, auth::TOKENS),
    r(Post, auth::JOIN_TOKENS),
    r(Post, auth::JOIN),
    r(Get, auth::PROXIES),
    r(Delete, auth::PROXY),
    r(Post, auth::PROXY_JOIN),
    r(Post, auth::PROXY_HEARTBEAT),
    r(Post, auth::PROXY_RENEW),
    r(Post, auth::PROXY_PRESENCE),
    r(Get, auth::NODES),
    r(Post, auth::NODES),
    r(Delete, auth::NODE),
    r(Post, auth::NODE_PRESENCE),
    r(Post, auth::NODE_PROXY_HOST_CERT),
    r(Post, auth::NODE_HOST_KEY),
    r(Post, auth::NODE_RENEW),
    r(Get, auth::SESSIONS),
    r(Get, auth::SESSION),
    r(Post, auth::SESSIONS),
    r(Post, auth::CONNECTIONS_CLOSED),
    r(Post, auth::SESSION_END),
    r(Post, auth::SESSION_CHECK),
    r(Post, auth::SESSION_UPDATE),
    r(Post, auth::SESSION_EVENTS),
    r(Get, auth::SESSION_RECORDING),
    r(Get, auth::LOCKS),
    r(Post, auth::LOCKS),
    r(Delete, auth::LOCK),
    r(Post, auth::AUTH_FAILURES),
    r(Post, auth::WEB_SESSIONS),
    r(Get, auth::WEB_SESSION),
    r(Post, auth::WEB_SESSION_TOUCH),
    r(Post, auth::WEB_SESSION_END),
    r(Post, auth::WEB_SESSIONS_CHECK),
    r(Post, auth::WEB_SSO),
    r(Get, auth::WEB_SSO_ONE),
    r(Delete, auth::WEB_SSO_ONE),
    r(Get, auth::KUBE_CLUSTERS),
    r(Post, auth::KUBE_CERTS),
    r(Post, auth::KUBE_ACCESS),
    r(Post, auth::KUBE_REQUESTS),
];

/// Every route the proxy's web API answers.
pub const WEB: &[Route] = &[
    r(Get, web::PING),
    r(Post, web::JOIN),
    r(Post, web::SIGNUP_START),
    r(Post, web::SIGNUP_FINISH),
    r(Post, web::LOGIN),
    r(Post, web::OIDC_LOGIN_START),
    r(Get, web::OIDC_CALLBACK),
    r(Post, web::OIDC_LOGIN_FINISH),
    r(Get, web::OIDC_WEB_START),
    r(Get, web::OIDC_WEB_FINISH),
    r(Post, web::WEB_LOGIN),
    r(Get, web::WEB_SESSION),
    r(Delete, web::WEB_SESSION),
    r(Get, web::NODES),
    r(Get, web::TERMINAL),
    r(Get, web::RECORDINGS),
    r(Get, web::RECORDING),
    r(Get, web::RECORDING_CAST),
    r(Get, web::AUDIT),
    r(Get, web::AUDIT_DOWNLOAD),
    r(Get, web::ROLES),
    r(Post, web::ROLES_VALIDATE),
    r(Get, web::ROLE),
    r(Put, web::ROLE),
    r(Delete, web::ROLE),
    r(Get, web::USERS),
    r(Post, web::USERS),
    r(Post, web::USER_RESET),
    r(Post, web::LOCKS),
    r(Delete, web::LOCK),
    r(Get, web::TOKENS),
    r(Post, web::TOKENS),
];

/// The pattern of the route of `list` that a concrete `path` (a query allowed) takes under
/// `method`: each `{parameter}` stands for exactly one segment. For labels that must not carry
/// the names inside paths (`crate::metrics`).
pub fn pattern_of(list: &[Route], method: Method, path: &str) -> Option<&'static str> {
    let path = path.split(['?', '#']).next().unwrap_or_default();
    list.iter()
        .filter(|r| r.method == method)
        .map(|r| r.pattern)
        .find(|pattern| {
            let mut want = pattern.split('/');
            let mut got = path.split('/');
            loop {
                match (want.next(), got.next()) {
                    (None, None) => return true,
                    (Some(w), Some(g)) if w == g || (w.starts_with('{') && !g.is_empty()) => {}
                    _ => return false,
                }
            }
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builders_make_one_segment_of_each_parameter() {
        for (built, want) in [
            (auth::user("alice"), "/v1/users/alice"),
            (auth::user_reset("a b"), "/v1/users/a%20b/reset"),
            (auth::ca("tls-user"), "/v1/ca/tls-user"),
            (auth::role("../x"), "/v1/roles/..%2Fx"),
            (
                auth::node_presence("../oidc/callback#"),
                "/v1/nodes/..%2Foidc%2Fcallback%23/presence",
            ),
            (auth::node(".."), "/v1/nodes/%20.."),
            (
                auth::session_events("s?x=1"),
                "/v1/sessions/s%3Fx%3D1/events",
            ),
            (auth::lock("7"), "/v1/locks/7"),
        ] {
            assert_eq!(built, want);
        }
    }

    #[test]
    fn every_route_is_listed_once_and_starts_at_v1() {
        for list in [AUTH, WEB] {
            let mut seen = std::collections::BTreeSet::new();
            for route in list {
                assert!(route.pattern.starts_with("/v1/"), "{route:?}");
                assert!(seen.insert(*route), "{route:?} listed twice");
            }
        }
    }

    #[test]
    fn the_oidc_callback_is_the_one_connectors_are_checked_against() {
        assert_eq!(web::OIDC_CALLBACK, crate::oidc::CALLBACK_PATH);
    }
}
