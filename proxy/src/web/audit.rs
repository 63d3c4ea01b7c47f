//! The audit log for the browser: a page at a time, and the whole filtered range as
//! `sallyctl audit search` prints it (one record a line, oldest first, as compact JSON),
//! streamed page by page so that no range is held whole and no timeout bounds its length.
//!
//! Auth decides who may search (`list` on `event`: auditors and editors), asked as the web
//! session's own certificate; a plain user gets auth's 403.
//!
//! Filters: `type`, `user`, `node`, `session` (exact), `since` and `until` (Unix seconds or
//! RFC 3339, both inclusive); paging: `limit` (1–1000, 100 by default) and `cursor` (the
//! `next_cursor` of the page before: records older than it).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::rejection::QueryRejection;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use sallyport_core::api::AuditQuery;
use sallyport_core::routes::auth;
use serde::Deserialize;

use super::browser::{ApiError, from_auth};
use super::sessions::WebSession;

type Web = State<Arc<super::Web>>;

/// A page's records at most.
pub const MAX_PAGE: u32 = 1000;
const DEFAULT_PAGE: u32 = 100;

/// The query a browser sends, every field text as typed.
#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub(crate) struct Filters {
    #[serde(rename = "type")]
    event_type: Option<String>,
    user: Option<String>,
    node: Option<String>,
    session: Option<String>,
    since: Option<String>,
    until: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

/// The query, or a JSON 400 naming what is wrong with it.
fn filters(f: Result<Query<Filters>, QueryRejection>) -> Result<Filters, ApiError> {
    f.map(|Query(f)| f).map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            format!(
                "{}; the filters are type, user, node, session, since, until, limit and cursor",
                e.body_text()
            ),
        )
    })
}

/// The last second an audit time can name (9999-12-31T23:59:59Z).
const LAST_SECOND: i64 = 253_402_300_799;

/// Unix seconds or RFC 3339, from 1970-01-01T00:00:01Z to the year 9999: auth reads 0 and
/// times past that as no filter at all, so they are refused here rather than matching
/// everything.
fn instant(name: &str, text: &str) -> Result<i64, ApiError> {
    let at = match text.parse::<i64>() {
        Ok(n) => Ok(n),
        Err(_) => time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc3339)
            .map(|t| t.unix_timestamp()),
    };
    if let Ok(n) = at
        && !(1..=LAST_SECOND).contains(&n)
    {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            format!("{name}: {text:?} is outside 1970-01-01T00:00:01Z to 9999-12-31T23:59:59Z"),
        ));
    }
    at.map_err(|_| {
            ApiError::new(
                StatusCode::BAD_REQUEST,
                format!(
                    "{name}: {text:?} is neither Unix seconds nor an RFC 3339 time such as 2026-01-31T09:00:00Z"
                ),
            )
        })
}

fn nonempty(v: &Option<String>) -> Option<String> {
    v.as_ref().filter(|s| !s.is_empty()).cloned()
}

impl Filters {
    /// The filters as auth's query (without paging).
    fn query(&self) -> Result<AuditQuery, ApiError> {
        let time = |name, v: &Option<String>| nonempty(v).map(|t| instant(name, &t)).transpose();
        Ok(AuditQuery {
            event_type: nonempty(&self.event_type),
            user: nonempty(&self.user),
            node: nonempty(&self.node),
            session: nonempty(&self.session),
            since: time("since", &self.since)?,
            until: time("until", &self.until)?,
            ..Default::default()
        })
    }

    fn limit(&self) -> Result<u32, ApiError> {
        match nonempty(&self.limit) {
            None => Ok(DEFAULT_PAGE),
            Some(l) => l
                .parse::<u32>()
                .ok()
                .filter(|l| (1..=MAX_PAGE).contains(l))
                .ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        format!("limit: {l:?} is not a number from 1 to {MAX_PAGE}"),
                    )
                }),
        }
    }

    fn cursor(&self) -> Result<Option<i64>, ApiError> {
        nonempty(&self.cursor)
            .map(|c| {
                c.parse::<i64>().ok().filter(|c| *c > 0).ok_or_else(|| {
                    ApiError::new(
                        StatusCode::BAD_REQUEST,
                        "cursor: use the next_cursor of the page before",
                    )
                })
            })
            .transpose()
    }
}

/// One query value, percent-encoded.
fn encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Auth's `/v1/audit` path for `q`.
fn audit_path(q: &AuditQuery) -> String {
    let mut parts = Vec::new();
    let mut text = |k: &str, v: &Option<String>| {
        if let Some(v) = v {
            parts.push(format!("{k}={}", encode(v)));
        }
    };
    text("type", &q.event_type);
    text("user", &q.user);
    text("node", &q.node);
    text("session", &q.session);
    for (k, v) in [
        ("since", q.since),
        ("until", q.until),
        ("limit", q.limit.map(i64::from)),
        ("before", q.before),
        ("after", q.after),
    ] {
        if let Some(v) = v {
            parts.push(format!("{k}={v}"));
        }
    }
    format!("{}?{}", auth::AUDIT, parts.join("&"))
}

async fn search(s: &WebSession, q: &AuditQuery) -> Result<Vec<serde_json::Value>, ApiError> {
    s.auth
        .json::<(), Vec<serde_json::Value>>(reqwest::Method::GET, &audit_path(q), None)
        .await
        .map_err(from_auth)
}

fn seq(record: &serde_json::Value) -> Option<i64> {
    record.get("seq").and_then(serde_json::Value::as_i64)
}

/// `GET /v1/webapi/audit`: one page, newest first: `{"events": [...], "next_cursor": N|null,
/// "unanchored_from": N|null}` (`next_cursor` null when this page reached the oldest record
/// that matches; `unanchored_from` the first seq of this page no signed checkpoint covers yet,
/// as `sallyctl audit search` warns: linked to the chain head, not yet beyond a database
/// writer's reach).
pub(crate) async fn page(
    State(web): Web,
    headers: HeaderMap,
    f: Result<Query<Filters>, QueryRejection>,
) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let f = filters(f)?;
    let limit = f.limit()?;
    let mut q = f.query()?;
    q.limit = Some(limit);
    q.before = f.cursor()?;
    let (mut events, unanchored): (Vec<serde_json::Value>, _) = s
        .auth
        .get_with_header(&audit_path(&q), sallyport_core::audit::UNANCHORED_HEADER)
        .await
        .map_err(from_auth)?;
    let unanchored_from = unanchored.and_then(|v| v.parse::<i64>().ok());
    events.reverse();
    let next_cursor = if events.len() as u64 >= u64::from(limit) {
        events.last().and_then(seq)
    } else {
        None
    };
    Ok(Json(serde_json::json!({
        "events": events,
        "next_cursor": next_cursor,
        "unanchored_from": unanchored_from,
    }))
    .into_response())
}

/// `GET /v1/webapi/audit/download`: every record that matches, oldest first, one compact JSON
/// object a line — byte for byte what `sallyctl audit search` prints for the same range. The
/// range ends at the newest match when the download starts; records written meanwhile are not
/// in it. Read from auth a page at a time, each page sent before the next is asked for.
pub(crate) async fn download(
    State(web): Web,
    headers: HeaderMap,
    f: Result<Query<Filters>, QueryRejection>,
) -> Result<Response, ApiError> {
    let s = web.browser.signed_in(&headers).await?;
    let f = filters(f)?;
    let base = f.query()?;
    // The newest match fixes the range's end; asked before answering so that a refusal (no
    // right to search, a bad filter) is a status, not a cut download.
    let newest = search(
        &s,
        &AuditQuery {
            limit: Some(1),
            ..base.clone()
        },
    )
    .await?;
    let end = newest.first().and_then(seq);
    let pages = range(end, MAX_PAGE, move |after, before| {
        let s = s.clone();
        let q = AuditQuery {
            limit: Some(MAX_PAGE),
            after: Some(after),
            before: Some(before),
            ..base.clone()
        };
        async move {
            // A download goes on only while its web session does (sign-out, a lock).
            if s.has_ended() {
                return Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    super::browser::NOT_SIGNED_IN,
                ));
            }
            search(&s, &q).await
        }
    });
    let mut resp = Body::from_stream(pages).into_response();
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/x-ndjson"),
    );
    h.insert(
        header::CONTENT_DISPOSITION,
        HeaderValue::from_static("attachment; filename=\"audit.jsonl\""),
    );
    Ok(resp)
}

/// The records up to seq `end` (none: nothing matches), oldest first as JSON lines, a page at
/// a time: `fetch(after, before)` gives the oldest `page` records with `after < seq < before`.
/// Each page goes out before the next is asked for; a failure ends the stream with an error.
fn range<F, Fut>(
    end: Option<i64>,
    page: u32,
    fetch: F,
) -> impl futures::Stream<Item = Result<bytes::Bytes, std::io::Error>> + Send
where
    F: Fn(i64, i64) -> Fut + Send + Sync,
    Fut: std::future::Future<Output = Result<Vec<serde_json::Value>, ApiError>> + Send,
{
    futures::stream::unfold((fetch, end, 0i64), move |(fetch, end, after)| async move {
        let end = end?;
        if after >= end {
            return None;
        }
        match fetch(after, end.saturating_add(1)).await {
            Ok(records) => {
                let mut text = String::new();
                for r in &records {
                    text.push_str(&r.to_string());
                    text.push('\n');
                }
                // A short page is the last; a full one goes on after its newest record.
                let next = match records.last().and_then(seq) {
                    Some(l) if records.len() as u64 >= u64::from(page) && l > after => l,
                    _ => end,
                };
                Some((Ok(bytes::Bytes::from(text)), (fetch, Some(end), next)))
            }
            Err(e) => {
                tracing::warn!(error = %e.message, "an audit download was cut");
                Some((Err(std::io::Error::other(e.message)), (fetch, None, after)))
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sallyport_core::audit::EventType;

    /// A download of 2,500 matching records (every third of 7,500), 1,000 a page, up to the
    /// range's end: each once, in order, and nothing past the end.
    #[tokio::test]
    async fn a_range_is_read_page_by_page_whole_and_in_order() {
        let all: Vec<serde_json::Value> = (1..=7_600)
            .filter(|s| s % 3 == 0)
            .map(|s| serde_json::json!({"seq": s, "event": "x"}))
            .collect();
        let end = 7_500;
        let asked = std::sync::Mutex::new(Vec::new());
        let fetch = |after: i64, before: i64| {
            if let Ok(mut a) = asked.lock() {
                a.push((after, before));
            }
            let page: Vec<_> = all
                .iter()
                .filter(|r| seq(r).is_some_and(|s| s > after && s < before))
                .take(1000)
                .cloned()
                .collect();
            async move { Ok(page) }
        };
        let chunks: Vec<_> = futures::StreamExt::collect(range(Some(end), 1000, fetch)).await;
        let mut text = String::new();
        for c in chunks {
            let Ok(c) = c else { panic!("a page failed") };
            text.push_str(&String::from_utf8_lossy(&c));
        }
        let want: String = all
            .iter()
            .filter(|r| seq(r).is_some_and(|s| s <= end))
            .map(|r| format!("{r}\n"))
            .collect();
        assert_eq!(text.lines().count(), 2500);
        assert_eq!(text, want);
        let asked = asked.lock().map(|a| a.clone()).unwrap_or_default();
        assert_eq!(asked, vec![(0, 7501), (3000, 7501), (6000, 7501)]);
        // Nothing matches: nothing asked, an empty body.
        let none: Vec<_> =
            futures::StreamExt::collect(range(None, 1000, |_, _| async { Ok(vec![]) })).await;
        assert!(none.is_empty());
    }

    #[test]
    fn filters_become_one_encoded_auth_query() {
        let f = Filters {
            event_type: Some(EventType::SessionStart.name().into()),
            user: Some("a&b=c".into()),
            node: Some(String::new()),
            since: Some("2026-01-31T09:00:00Z".into()),
            until: Some("1769850000".into()),
            ..Default::default()
        };
        let mut q = f.query().unwrap_or_default();
        q.limit = Some(5);
        assert_eq!(
            audit_path(&q),
            format!(
                "/v1/audit?type={}&user=a%26b%3Dc&since=1769850000&until=1769850000&limit=5",
                EventType::SessionStart.name()
            )
        );
    }

    #[test]
    fn bad_paging_and_times_are_refused_with_what_to_send() {
        for (f, want) in [
            (
                Filters {
                    limit: Some("0".into()),
                    ..Default::default()
                },
                "limit",
            ),
            (
                Filters {
                    limit: Some("1001".into()),
                    ..Default::default()
                },
                "limit",
            ),
            (
                Filters {
                    cursor: Some("-3".into()),
                    ..Default::default()
                },
                "cursor",
            ),
            (
                Filters {
                    since: Some("yesterday".into()),
                    ..Default::default()
                },
                "since",
            ),
            (
                Filters {
                    until: Some("0".into()),
                    ..Default::default()
                },
                "until",
            ),
            (
                Filters {
                    since: Some("99999999999999".into()),
                    ..Default::default()
                },
                "since",
            ),
        ] {
            let err = f
                .limit()
                .and_then(|_| f.cursor())
                .and_then(|_| f.query().map(|_| ()))
                .err()
                .map(|e| (e.status, e.message));
            let (status, message) = err.unwrap_or_else(|| panic!("{want} accepted"));
            assert_eq!(status, StatusCode::BAD_REQUEST);
            assert!(message.starts_with(want), "{message}");
        }
    }
}
