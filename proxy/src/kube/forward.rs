//! One request to a cluster's API server, through its kube agent's tunnel: a yamux stream
//! carrying HTTP/1.1 (the agent adds its own credentials upstream). Bodies stream both ways;
//! an upgrade the API server accepts (exec, attach, port-forward) becomes a byte pipe between
//! the person's connection and the stream.

use axum::body::Body;
use axum::http::{HeaderMap, HeaderName, HeaderValue, Request, Response, StatusCode, header};
use hyper_util::rt::TokioIo;
use sallyport_core::tunnel::Opener;

/// Headers that belong to one connection, never passed on (RFC 9110 §7.6.1), plus the ones
/// HTTP/2 forbids.
const HOP_BY_HOP: &[&str] = &[
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Is this request asking to switch protocols (WebSocket or SPDY)?
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    headers.contains_key(header::UPGRADE)
        && headers
            .get_all(header::CONNECTION)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .any(|v| {
                v.split(',')
                    .any(|t| t.trim().eq_ignore_ascii_case("upgrade"))
            })
}

/// Removes what must not cross this hop, and whatever the `Connection` header names.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for n in named {
        headers.remove(n);
    }
    for h in HOP_BY_HOP {
        headers.remove(*h);
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    #[error("the cluster's agent is not connected")]
    Offline,
    /// Its tunnel carries as many streams as it may (each request, watch, exec and port-forward
    /// is one).
    #[error("{0}")]
    Busy(sallyport_core::tunnel::OpenError),
    #[error("the cluster's agent did not answer: {0}")]
    Agent(String),
}

/// Sends `req` (already authorized, its path the API server's, its headers final) to the agent
/// and returns the answer; an accepted upgrade is joined to `client_upgrade`.
/// How the door controls an upgraded stream it does not read (port-forward): `stop` ends it
/// with a reason (a lock, an expired certificate); `ended` hears how it ended (the reason, or
/// none when a side closed it).
pub struct PipeControl {
    pub stop: tokio::sync::oneshot::Receiver<String>,
    pub ended: tokio::sync::oneshot::Sender<Option<String>>,
    /// Where the pod ports the person's streams name are kept (`super::ports`).
    pub ports: super::ports::Seen,
}

pub async fn forward(
    opener: &Opener,
    req: Request<Body>,
    client_upgrade: Option<hyper::upgrade::OnUpgrade>,
    control: Option<PipeControl>,
) -> Result<Response<Body>, ForwardError> {
    let stream = opener.open().await.map_err(|e| match e {
        full @ sallyport_core::tunnel::OpenError::Full(_) => ForwardError::Busy(full),
        sallyport_core::tunnel::OpenError::Closed => ForwardError::Offline,
    })?;
    // One task owns the yamux stream: two tasks on one stream lose wake-ups.
    let io = TokioIo::new(sallyport_core::flow::Decoupled::new(stream));
    let (mut sender, conn) = hyper::client::conn::http1::Builder::new()
        .handshake::<_, Body>(io)
        .await
        .map_err(|e| ForwardError::Agent(e.to_string()))?;
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "kube agent stream ended");
        }
    });
    let mut resp = sender
        .send_request(req)
        .await
        .map_err(|e| ForwardError::Agent(e.to_string()))?;
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ForwardError::Agent(
                "the API server switched protocols unasked".into(),
            ));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        // kubectl names the ports inside SPDY, plain or in WebSocket messages.
        let carrier = if resp
            .headers()
            .get(header::SEC_WEBSOCKET_PROTOCOL)
            .is_some_and(|p| p.as_bytes() == super::ports::SPDY_IN_WEBSOCKET.as_bytes())
        {
            Some(super::ports::Carrier::WebSocket)
        } else if resp
            .headers()
            .get(header::UPGRADE)
            .and_then(|u| u.to_str().ok())
            .is_some_and(|u| u.eq_ignore_ascii_case("SPDY/3.1"))
        {
            Some(super::ports::Carrier::Spdy)
        } else {
            None
        };
        tokio::spawn(async move {
            let (stop, ended, watcher) = match control {
                Some(c) => (
                    Some(c.stop),
                    Some(c.ended),
                    carrier.map(|k| super::ports::Watcher::new(k, c.ports)),
                ),
                None => (None, None, None),
            };
            // A dropped sender is no order to stop.
            let stop = async move {
                match stop {
                    Some(rx) => match rx.await {
                        Ok(why) => why,
                        Err(_) => std::future::pending().await,
                    },
                    None => std::future::pending().await,
                }
            };
            let why = match tokio::join!(client_upgrade, upstream_upgrade) {
                (Ok(client), Ok(upstream)) => {
                    let client = TokioIo::new(client);
                    let mut upstream = TokioIo::new(upstream);
                    let copy = async {
                        let r = match watcher {
                            Some(w) => {
                                let mut client = super::ports::Watched::new(client, w);
                                tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                            }
                            None => {
                                let mut client = client;
                                tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                            }
                        };
                        if let Err(e) = r {
                            tracing::debug!(error = %e, "upgraded kube stream ended");
                        }
                    };
                    tokio::select! {
                        () = copy => None,
                        why = stop => Some(why),
                    }
                }
                (c, u) => {
                    tracing::debug!(client = ?c.err(), upstream = ?u.err(), "upgrade not completed");
                    None
                }
            };
            if let Some(e) = ended {
                let _ = e.send(why);
            }
        });
        let (parts, _) = resp.into_parts();
        return Ok(Response::from_parts(parts, Body::empty()));
    }
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    Ok(Response::from_parts(parts, Body::new(body)))
}

/// The request the agent gets: the API server's path and query, the person's headers less the
/// hop-by-hop ones, any `Authorization` and every `Impersonate-*`, then the door's principals.
pub fn upstream_request(
    method: axum::http::Method,
    path_and_query: &str,
    mut headers: HeaderMap,
    body: Body,
    user: &str,
    groups: &[String],
    client: &str,
) -> Result<Request<Body>, String> {
    let upgrade = is_upgrade(&headers);
    let (upgrade_to, connection) = (
        headers.get(header::UPGRADE).cloned(),
        headers.get(header::CONNECTION).cloned(),
    );
    strip_hop_by_hop(&mut headers);
    headers.remove(header::AUTHORIZATION);
    headers.remove(header::HOST);
    let impersonate: Vec<HeaderName> = headers
        .keys()
        // The front-proxy headers too (`X-Remote-User`, `-Group`, `-Extra-*`): an API server
        // with request-header authentication would take them as the caller.
        .filter(|k| {
            let k = k.as_str();
            k.starts_with("impersonate-")
                || k.starts_with("x-remote-")
                || k.starts_with("x-forwarded-")
                || k == "forwarded"
                || k == "x-real-ip"
        })
        .cloned()
        .collect();
    for k in impersonate {
        headers.remove(k);
    }
    let value =
        |v: &str| HeaderValue::from_str(v).map_err(|_| format!("{v:?} is not a header value"));
    headers.insert("impersonate-user", value(user)?);
    for g in groups {
        headers.append("impersonate-group", value(g)?);
    }
    // The API server's audit log names the person's address, as the door saw it, never one
    // the person wrote.
    if let Some(ip) = client
        .parse::<std::net::SocketAddr>()
        .ok()
        .and_then(|a| HeaderValue::from_str(&a.ip().to_string()).ok())
    {
        headers.insert("x-forwarded-for", ip);
    }
    // The agent replaces it with the API server's.
    headers.insert(header::HOST, HeaderValue::from_static("kube-agent"));
    if upgrade {
        if let Some(u) = upgrade_to {
            headers.insert(header::UPGRADE, u);
        }
        headers.insert(
            header::CONNECTION,
            connection.unwrap_or(HeaderValue::from_static("Upgrade")),
        );
    }
    let mut req = Request::builder()
        .method(method)
        .uri(path_and_query)
        .version(axum::http::Version::HTTP_11)
        .body(body)
        .map_err(|e| e.to_string())?;
    *req.headers_mut() = headers;
    Ok(req)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_gets_the_doors_principals_and_nothing_of_the_persons_identity() {
        let mut h = HeaderMap::new();
        for (k, v) in [
            ("authorization", "Bearer stolen"),
            ("impersonate-user", "root"),
            ("Impersonate-Group", "system:masters"),
            ("impersonate-uid", "0"),
            ("impersonate-extra-scopes", "x"),
            ("x-remote-user", "admin"),
            ("X-Remote-Group", "system:masters"),
            ("x-remote-extra-foo", "bar"),
            ("x-forwarded-for", "10.0.0.1"),
            ("x-real-ip", "10.0.0.1"),
            ("connection", "keep-alive, x-secret"),
            ("x-secret", "hop"),
            ("accept", "application/json"),
        ] {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap_or_else(|e| panic!("{e}")),
                HeaderValue::from_static(v),
            );
        }
        let groups = vec!["devs".to_string(), "system:authenticated".to_string()];
        let req = upstream_request(
            axum::http::Method::GET,
            "/api/v1/pods",
            h,
            Body::empty(),
            "alice",
            &groups,
            "192.0.2.7:4242",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let h = req.headers();
        assert!(h.get("authorization").is_none());
        assert!(h.get("impersonate-uid").is_none() && h.get("impersonate-extra-scopes").is_none());
        assert!(h.keys().all(|k| !k.as_str().starts_with("x-remote-")));
        assert!(h.get("x-secret").is_none() && h.get("connection").is_none());
        assert_eq!(h.get_all("impersonate-user").iter().count(), 1);
        assert_eq!(
            h.get("impersonate-user"),
            Some(&HeaderValue::from_static("alice"))
        );
        let got: Vec<_> = h.get_all("impersonate-group").iter().collect();
        assert_eq!(got, vec!["devs", "system:authenticated"]);
        assert_eq!(
            h.get("accept"),
            Some(&HeaderValue::from_static("application/json"))
        );
        assert_eq!(req.uri(), "/api/v1/pods");
        assert!(h.get("x-real-ip").is_none());
        let fwd: Vec<_> = h.get_all("x-forwarded-for").iter().collect();
        assert_eq!(fwd, vec!["192.0.2.7"]);
    }
}
