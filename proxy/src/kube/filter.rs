//! Lists and watches narrowed to what the roles allow. A role may allow some objects of a
//! collection and not others (`{kind: pod, namespace: dev, name: 'web-*'}`, or dev's pods when
//! kubectl asks for every namespace's): the door then forwards the list or watch, as Teleport
//! does, and keeps only the items the roles allow, each decided by `RoleSet::check_kube` on its
//! own namespace and name for the request's verb.
//!
//! 1. [`decide`]: the roles' decision on a request, lists considered. A list every item of
//!    which the roles allow (and no deny rule could touch) is forwarded as it is; one of which
//!    no item could be allowed is refused (403) before anything is sent; the rest are filtered,
//!    impersonating the principals of the roles that could allow an item.
//! 2. [`Filter::ask_for_json`]: only JSON can be read item by item, so the request's `Accept`
//!    keeps its JSON media ranges (with their `as=Table` parameters) and nothing else, and
//!    `Accept-Encoding` is gzip or nothing; a gzipped answer is read through gzip and served
//!    plain.
//! 3. [`Filter::narrow`]: a JSON list keeps the `items`, a `Table` the `rows`, a watch the
//!    events whose object the roles allow; everything else of the answer is kept byte for byte.
//!    A watch is read event by event as it arrives, never whole.
//!
//! Architecture invariant: nothing the roles do not allow passes unfiltered. An answer the door
//! cannot read — protobuf, YAML, CBOR, an unknown encoding, a body that is not what was asked
//! for, an item without its metadata — is refused or dropped, never passed on as it came. The
//! API server's own refusals (non-2xx, a `Status`) pass as they are: they hold no items.
//!
//! Memory is bounded: a list over [`MAX_LIST`] (read or inflated) is refused with a Status, and
//! a watch event over [`MAX_EVENT`] ends the watch with an `ERROR` event.

use std::io::{Read, Write};
use std::sync::Arc;

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Response, StatusCode, header};
use bytes::Bytes;
use futures::StreamExt;
use sallyport_core::kube::Classified;
use sallyport_core::role::{Decision, KubeRequest};
use serde::Deserialize;
use serde::de::{Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::access::Snapshot;

/// The largest list body the door reads to filter (compressed and inflated alike). `kubectl
/// get` asks for 500 items at a time, a few MiB at most.
pub const MAX_LIST: usize = 64 << 20;
/// The largest single watch event.
pub const MAX_EVENT: usize = 16 << 20;
/// What the audit record says of a filtered request.
pub const FILTERED: &str = "allowed, filtered to what the roles allow";

/// The roles' decision on one request (not discovery), `whole` being `check_kube`'s on the
/// request as it is. A list or watch of a collection (no name) is forwarded as it is when the
/// roles allow every item of it; filtered when some item could be allowed
/// (`RoleSet::kube_may_list`); else refused. Any other request is `whole`.
pub fn decide(
    snap: &Arc<Snapshot>,
    c: &Classified,
    whole: Decision,
) -> Result<Option<Filter>, String> {
    let collection = c.name.is_empty()
        && c.subresource.is_empty()
        && !c.resource.is_empty()
        && matches!(c.verb, "list" | "watch");
    if !collection
        || (whole.allowed
            && snap
                .roles
                .kube_allows_whole_list(&snap.labels, &c.kind, &c.namespace, c.verb))
    {
        return if whole.allowed {
            Ok(None)
        } else {
            Err(whole.explanation)
        };
    }
    if !snap
        .roles
        .kube_may_list(&snap.labels, &c.kind, &c.namespace, c.verb)
    {
        return Err(if whole.allowed {
            "a role denies every one of them".to_string()
        } else {
            whole.explanation
        });
    }
    let (groups, users) =
        snap.roles
            .kube_principals_for_list(&snap.labels, &c.kind, &c.namespace, c.verb);
    let (snap, kind, verb) = (snap.clone(), c.kind.clone(), c.verb);
    let allows = move |namespace: &str, name: &str| {
        // A namespace's own name is the namespace the rules speak of (as `classify` reads it).
        let namespace = if kind == "namespace" { name } else { namespace };
        snap.roles
            .check_kube(
                &snap.labels,
                &KubeRequest {
                    kind: &kind,
                    namespace,
                    name,
                    verb,
                },
            )
            .allowed
    };
    let mut f = Filter::new(allows, c.verb == "watch");
    f.groups = groups;
    f.users = users;
    Ok(Some(f))
}

/// A refusal the filter makes: its code and words, as a Status kubectl prints.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub code: StatusCode,
    pub why: String,
}

impl Refusal {
    fn new(code: StatusCode, why: impl Into<String>) -> Self {
        Refusal {
            code,
            why: why.into(),
        }
    }

    pub fn response(&self) -> Response<Body> {
        let reason = match self.code {
            StatusCode::NOT_ACCEPTABLE => "NotAcceptable",
            code => sallyport_core::kube::reason_for(code.as_u16()),
        };
        let body = sallyport_core::kube::status(self.code.as_u16(), reason, &self.why);
        let mut resp = Response::new(Body::from(body.to_string()));
        *resp.status_mut() = self.code;
        let h = resp.headers_mut();
        h.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
        resp
    }
}

type Allows = dyn Fn(&str, &str) -> bool + Send + Sync;

/// One list or watch being narrowed: which items the roles allow, and whom to impersonate.
#[derive(Clone)]
pub struct Filter {
    /// (namespace, name) of an item → may the person see it?
    allows: Arc<Allows>,
    watch: bool,
    /// The principals of the roles that could allow an item.
    pub groups: Vec<String>,
    pub users: Vec<String>,
}

impl std::fmt::Debug for Filter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Filter")
            .field("watch", &self.watch)
            .field("groups", &self.groups)
            .field("users", &self.users)
            .finish_non_exhaustive()
    }
}

impl Filter {
    pub fn new(allows: impl Fn(&str, &str) -> bool + Send + Sync + 'static, watch: bool) -> Self {
        Filter {
            allows: Arc::new(allows),
            watch,
            groups: Vec::new(),
            users: Vec::new(),
        }
    }

    /// Makes the request ask for JSON only, gzipped only if the person takes gzip (so that the
    /// API server's own refusals, which pass as they are, come in a form the person reads);
    /// refused (406) when the person accepts nothing JSON.
    pub fn ask_for_json(&self, headers: &mut HeaderMap) -> Result<(), Refusal> {
        let asked: Vec<&str> = headers
            .get_all(header::ACCEPT)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .collect();
        let accept = if asked.is_empty() {
            Some("application/json".to_string())
        } else {
            json_accept(&asked.join(","))
        };
        let Some(accept) = accept.and_then(|a| HeaderValue::from_str(&a).ok()) else {
            return Err(Refusal::new(
                StatusCode::NOT_ACCEPTABLE,
                "your roles allow only some of these, and only a JSON answer can be filtered: ask for application/json",
            ));
        };
        headers.insert(header::ACCEPT, accept);
        if accepts_gzip(headers) {
            headers.insert(header::ACCEPT_ENCODING, HeaderValue::from_static("gzip"));
        } else {
            headers.remove(header::ACCEPT_ENCODING);
        }
        Ok(())
    }

    /// The API server's answer with only what the roles allow, and the audit record's `allowed`
    /// and `reason`.
    pub async fn narrow(&self, resp: Response<Body>) -> (Response<Body>, bool, String) {
        match self.try_narrow(resp).await {
            Ok(resp) => (resp, true, FILTERED.to_string()),
            Err(r) => {
                let why = format!("allowed, but the answer could not be filtered: {}", r.why);
                (r.response(), false, why)
            }
        }
    }

    async fn try_narrow(&self, resp: Response<Body>) -> Result<Response<Body>, Refusal> {
        // The API server's refusal: a Status, no items.
        if !resp.status().is_success() {
            return Ok(resp);
        }
        let (mut parts, body) = resp.into_parts();
        let gzip = readable(&parts.headers)?;
        parts.headers.remove(header::CONTENT_ENCODING);
        parts.headers.remove(header::CONTENT_LENGTH);
        if self.watch {
            let body = Body::from_stream(watch_stream(self.clone(), body, gzip, MAX_EVENT));
            return Ok(Response::from_parts(parts, body));
        }
        let raw = read_bounded(body, MAX_LIST).await?;
        // No body (the answer to HEAD): no items to hide.
        if raw.is_empty() {
            return Ok(Response::from_parts(parts, Body::empty()));
        }
        let json = if gzip { gunzip(&raw, MAX_LIST)? } else { raw };
        let out = self.list(&json)?;
        Ok(Response::from_parts(parts, Body::from(out)))
    }

    /// A list (`kind: ...List`, its `items`) or a `Table` (its `rows`), narrowed; the rest of
    /// it as it came.
    pub fn list(&self, body: &[u8]) -> Result<Vec<u8>, Refusal> {
        let unreadable = |why: &str| {
            Refusal::new(
                StatusCode::BAD_GATEWAY,
                format!("the API server's list {why}"),
            )
        };
        let text = std::str::from_utf8(body).map_err(|_| unreadable("is not UTF-8"))?;
        let fields: Fields<'_> =
            serde_json::from_str(text).map_err(|_| unreadable("is not a JSON object"))?;
        let kind = fields.string("kind").unwrap_or_default();
        let key = if is_table(&fields) {
            "rows"
        } else if kind.ends_with("List") {
            "items"
        } else {
            return Err(unreadable(&format!(
                "is a {kind:?}, not a list that can be filtered"
            )));
        };
        let mut out = match fields.get(key) {
            None => return Ok(body.to_vec()),
            Some(v) if v.get() == "null" => return Ok(body.to_vec()),
            Some(v) => {
                let elements: Vec<&RawValue> = serde_json::from_str(v.get())
                    .map_err(|_| unreadable(&format!("has no array of {key}")))?;
                let (kept, _) = self.keep(key, &elements);
                // A filtered list is asked for whole (`whole_list_query`): a `continue` token
                // names the last item the API server saw, hidden or not, and
                // `remainingItemCount` counts hidden items too. Neither goes on, whatever
                // came.
                let metadata = match fields.get("metadata") {
                    Some(m) => serde_json::from_str::<Fields<'_>>(m.get())
                        .ok()
                        .filter(|m| {
                            m.get("remainingItemCount").is_some() || m.get("continue").is_some()
                        })
                        .map(|m| m.write_without(&["remainingItemCount", "continue"])),
                    None => None,
                };
                let metadata = metadata.and_then(|m| String::from_utf8(m).ok());
                match &metadata {
                    Some(m) => fields.write_with(&[(key, &kept), ("metadata", m)]),
                    None => fields.write_with(&[(key, &kept)]),
                }
            }
        };
        out.push(b'\n');
        Ok(out)
    }

    /// The elements (`items` or `rows`) the roles allow, as a JSON array, and whether any
    /// were left out.
    fn keep(&self, key: &str, elements: &[&RawValue]) -> (String, bool) {
        let mut out = String::from("[");
        let mut dropped = false;
        for e in elements {
            let allowed = if key == "rows" {
                self.row_allowed(e)
            } else {
                self.object_allowed(e)
            };
            if allowed {
                if out.len() > 1 {
                    out.push(',');
                }
                out.push_str(e.get());
            } else {
                dropped = true;
            }
        }
        out.push(']');
        (out, dropped)
    }

    /// An object (or a PartialObjectMetadata) by its metadata; one without is not shown.
    fn object_allowed(&self, object: &RawValue) -> bool {
        #[derive(Deserialize)]
        struct Object {
            metadata: Option<Meta>,
        }
        #[derive(Deserialize)]
        struct Meta {
            #[serde(default)]
            namespace: String,
            #[serde(default)]
            name: String,
        }
        match serde_json::from_str::<Object>(object.get()) {
            Ok(Object { metadata: Some(m) }) => (self.allows)(&m.namespace, &m.name),
            _ => false,
        }
    }

    /// A Table row by its `object` (PartialObjectMetadata unless `includeObject` said
    /// otherwise); a row without one (`includeObject=None`) cannot be told and is not shown.
    fn row_allowed(&self, row: &RawValue) -> bool {
        #[derive(Deserialize)]
        struct Row<'a> {
            #[serde(borrow)]
            object: Option<&'a RawValue>,
        }
        match serde_json::from_str::<Row<'_>>(row.get()) {
            Ok(Row {
                object: Some(object),
            }) => self.object_allowed(object),
            _ => false,
        }
    }

    /// One watch event: as it came, with its Table's rows narrowed, or none when the roles
    /// allow nothing of it.
    fn event(&self, raw: &[u8], carry: &mut Carry) -> Result<Option<Vec<u8>>, String> {
        let text =
            std::str::from_utf8(raw).map_err(|_| "a watch event is not UTF-8".to_string())?;
        let event: Fields<'_> =
            serde_json::from_str(text).map_err(|_| "a watch event is not a JSON object")?;
        let kind = event.string("type");
        let object = event.get("object");
        let whole = |mut v: Vec<u8>| {
            v.push(b'\n');
            Some(v)
        };
        if matches!(kind.as_deref(), Some("BOOKMARK" | "ERROR")) {
            return Ok(whole(raw.to_vec()));
        }
        let Some(object) = object else {
            return Ok(None);
        };
        let Ok(table) = serde_json::from_str::<Fields<'_>>(object.get()) else {
            return Ok(None);
        };
        if !is_table(&table) {
            return Ok(if self.object_allowed(object) {
                whole(raw.to_vec())
            } else {
                None
            });
        }
        let rows: Vec<&RawValue> = match table.get("rows") {
            Some(r) => serde_json::from_str(r.get()).unwrap_or_default(),
            None => Vec::new(),
        };
        let columns = table
            .get("columnDefinitions")
            .filter(|c| c.get() != "null")
            .map(|c| c.get().to_string());
        let (kept, _) = self.keep("rows", &rows);
        if kept == "[]" {
            // kubectl prints later rows with the columns of the first Table it saw: keep them
            // for the next event shown.
            if columns.is_some() {
                carry.columns = columns;
            }
            return Ok(None);
        }
        let mut replace: Vec<(&str, &str)> = vec![("rows", &kept)];
        let carried = match columns {
            Some(_) => {
                carry.columns = None;
                None
            }
            None => carry.columns.take(),
        };
        if let Some(c) = &carried {
            replace.push(("columnDefinitions", c));
        }
        let object = String::from_utf8(table.write_with(&replace)).unwrap_or_default();
        Ok(whole(event.write_with(&[("object", &object)])))
    }
}

/// What one watch remembers between events.
#[derive(Default)]
struct Carry {
    /// The columns of a Table event the roles hid all of.
    columns: Option<String>,
}

/// The query of a list the door filters, without `limit` and `continue`: the API server
/// answers with the whole list (bounded by [`MAX_LIST`]), never a page whose token would name
/// a hidden item. Everything else stays exactly as written.
pub fn whole_list_query(query: &str) -> String {
    query
        .split('&')
        .filter(|pair| {
            let key = pair.split('=').next().unwrap_or_default();
            let key: String = url::form_urlencoded::parse(key.as_bytes())
                .map(|(k, _)| k.into_owned())
                .next()
                .unwrap_or_default();
            !pair.is_empty() && key != "limit" && key != "continue"
        })
        .collect::<Vec<_>>()
        .join("&")
}

fn is_table(fields: &Fields<'_>) -> bool {
    fields.string("kind").as_deref() == Some("Table")
        && matches!(
            fields.string("apiVersion").as_deref(),
            Some("meta.k8s.io/v1" | "meta.k8s.io/v1beta1")
        )
}

/// The JSON media ranges of an `Accept` header (`*/*` and `application/*` read as JSON), with
/// their parameters; none when there are none.
fn json_accept(accept: &str) -> Option<String> {
    let kept: Vec<String> = accept
        .split(',')
        .map(str::trim)
        .filter(|r| !r.is_empty())
        .filter_map(|range| {
            let (media, params) = match range.split_once(';') {
                Some((m, p)) => (m.trim(), Some(p.trim())),
                None => (range, None),
            };
            let media = media.to_ascii_lowercase();
            if !matches!(media.as_str(), "application/json" | "application/*" | "*/*") {
                return None;
            }
            Some(match params {
                Some(p) if !p.is_empty() => format!("application/json;{p}"),
                _ => "application/json".to_string(),
            })
        })
        .collect();
    (!kept.is_empty()).then(|| kept.join(","))
}

/// Does the person's `Accept-Encoding` take gzip (kubectl's always does)?
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|coding| {
            let mut parts = coding.split(';').map(str::trim);
            let name = parts.next().unwrap_or_default();
            let refused = parts.any(|p| {
                p.strip_prefix("q=")
                    .and_then(|q| q.parse::<f32>().ok())
                    .is_some_and(|q| q <= 0.0)
            });
            (name.eq_ignore_ascii_case("gzip") || name == "*") && !refused
        })
}

/// Is the answer JSON the door can read, and is it gzipped?
fn readable(headers: &HeaderMap) -> Result<bool, Refusal> {
    let media = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = media.split(';').next().unwrap_or_default().trim();
    if !essence.eq_ignore_ascii_case("application/json") {
        let what = if media.is_empty() {
            "no content type"
        } else {
            media
        };
        return Err(Refusal::new(
            StatusCode::NOT_ACCEPTABLE,
            format!(
                "the API server answered {what}, which Sallyport cannot filter to what your roles allow: ask for application/json"
            ),
        ));
    }
    let encodings: Vec<String> = headers
        .get_all(header::CONTENT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .map(|e| e.trim().to_ascii_lowercase())
        .filter(|e| !e.is_empty() && e != "identity")
        .collect();
    match encodings.as_slice() {
        [] => Ok(false),
        [e] if e == "gzip" || e == "x-gzip" => Ok(true),
        _ => Err(Refusal::new(
            StatusCode::BAD_GATEWAY,
            format!(
                "the API server's answer is encoded {}, which Sallyport cannot read to filter it",
                encodings.join(", ")
            ),
        )),
    }
}

fn too_large() -> Refusal {
    Refusal::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!(
            "the list is over {} MiB, more than Sallyport filters to what your roles allow: ask for less at a time (kubectl get --chunk-size, a label selector, a namespace)",
            MAX_LIST >> 20
        ),
    )
}

/// A body, read whole up to `limit` bytes.
async fn read_bounded(body: Body, limit: usize) -> Result<Vec<u8>, Refusal> {
    let mut stream = body.into_data_stream();
    let mut out = Vec::new();
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|_| {
            Refusal::new(
                StatusCode::BAD_GATEWAY,
                "the API server's answer ended early; try again",
            )
        })?;
        if out.len() + chunk.len() > limit {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

/// Inflates a gzip body, up to `limit` bytes of it.
fn gunzip(raw: &[u8], limit: usize) -> Result<Vec<u8>, Refusal> {
    let mut out = Vec::new();
    flate2::read::MultiGzDecoder::new(raw)
        .take(limit as u64 + 1)
        .read_to_end(&mut out)
        .map_err(|_| {
            Refusal::new(
                StatusCode::BAD_GATEWAY,
                "the API server's gzipped answer does not inflate",
            )
        })?;
    if out.len() > limit {
        return Err(too_large());
    }
    Ok(out)
}

/// A watch as it arrives: the upstream body inflated if gzipped, cut into events, each
/// narrowed. Ends with an `ERROR` event when it cannot go on (an event over [`MAX_EVENT`], not
/// JSON), and breaks off when the upstream does.
fn watch_stream(
    filter: Filter,
    body: Body,
    gzip: bool,
    limit: usize,
) -> impl futures::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static {
    let watch = Watch {
        filter,
        framer: Framer::new(limit),
        gzip: gzip.then(|| flate2::write::MultiGzDecoder::new(Vec::new())),
        carry: Carry::default(),
    };
    let state = (body.into_data_stream(), watch, false);
    futures::stream::unfold(state, |(mut upstream, mut watch, done)| async move {
        if done {
            return None;
        }
        loop {
            match upstream.next().await {
                Some(Ok(chunk)) => match watch.feed(&chunk) {
                    Ok(out) if out.is_empty() => continue,
                    Ok(out) => return Some((Ok(Bytes::from(out)), (upstream, watch, false))),
                    Err(why) => {
                        tracing::debug!(why, "kube watch ended by its filter");
                        return Some((Ok(error_event(&why)), (upstream, watch, true)));
                    }
                },
                Some(Err(e)) => {
                    return Some((
                        Err(std::io::Error::other(e.to_string())),
                        (upstream, watch, true),
                    ));
                }
                // What is left unfinished is an event cut short: nothing to show of it.
                None => return None,
            }
        }
    })
}

/// An `ERROR` watch event carrying a Status: how a watch that cannot go on says why.
fn error_event(why: &str) -> Bytes {
    let status = sallyport_core::kube::status(500, "InternalError", why);
    let mut out = serde_json::json!({"type": "ERROR", "object": status}).to_string();
    out.push('\n');
    Bytes::from(out)
}

struct Watch {
    filter: Filter,
    framer: Framer,
    gzip: Option<flate2::write::MultiGzDecoder<Vec<u8>>>,
    carry: Carry,
}

/// Compressed input is inflated this much at a time, so that one chunk cannot inflate past
/// the event limit unseen (deflate inflates at most about 1032 to 1).
const INFLATE_STEP: usize = 4 << 10;

impl Watch {
    /// Takes the next bytes of the body; returns the events they complete that the roles
    /// allow.
    fn feed(&mut self, chunk: &[u8]) -> Result<Vec<u8>, String> {
        let mut out = Vec::new();
        if self.gzip.is_none() {
            self.push(chunk, &mut out)?;
            return Ok(out);
        }
        for piece in chunk.chunks(INFLATE_STEP) {
            let inflated = match self.gzip.as_mut() {
                Some(gz) => {
                    gz.write_all(piece)
                        .and_then(|()| gz.flush())
                        .map_err(|_| "the API server's gzipped watch does not inflate")?;
                    std::mem::take(gz.get_mut())
                }
                None => Vec::new(),
            };
            self.push(&inflated, &mut out)?;
        }
        Ok(out)
    }

    fn push(&mut self, bytes: &[u8], out: &mut Vec<u8>) -> Result<(), String> {
        let (framer, filter, carry) = (&mut self.framer, &self.filter, &mut self.carry);
        framer.push(bytes, |event| {
            if let Some(e) = filter.event(event, carry)? {
                out.extend_from_slice(&e);
            }
            Ok(())
        })
    }
}

/// Cuts a stream of JSON objects (one a line as the API server writes them, or simply one
/// after another) into whole objects, scanning each byte once: strings and escapes are
/// followed so that a brace inside one does not count.
struct Framer {
    buf: Vec<u8>,
    /// Where the object being read begins.
    start: usize,
    /// The next byte to scan.
    pos: usize,
    depth: usize,
    in_string: bool,
    escaped: bool,
    limit: usize,
}

impl Framer {
    fn new(limit: usize) -> Self {
        Framer {
            buf: Vec::new(),
            start: 0,
            pos: 0,
            depth: 0,
            in_string: false,
            escaped: false,
            limit,
        }
    }

    /// Adds `bytes`; `each` gets every object they complete, in order.
    fn push(
        &mut self,
        bytes: &[u8],
        mut each: impl FnMut(&[u8]) -> Result<(), String>,
    ) -> Result<(), String> {
        self.buf.extend_from_slice(bytes);
        while self.pos < self.buf.len() {
            let b = self.buf[self.pos];
            self.pos += 1;
            if self.pos - self.start > self.limit {
                return Err(format!(
                    "a watch event is over {} MiB, more than Sallyport filters to what your roles allow",
                    self.limit >> 20
                ));
            }
            if self.depth == 0 {
                match b {
                    b' ' | b'\t' | b'\r' | b'\n' => self.start = self.pos,
                    b'{' => self.depth = 1,
                    _ => return Err("the watch is not a stream of JSON objects".into()),
                }
                continue;
            }
            if self.in_string {
                if self.escaped {
                    self.escaped = false;
                } else if b == b'\\' {
                    self.escaped = true;
                } else if b == b'"' {
                    self.in_string = false;
                }
                continue;
            }
            match b {
                b'"' => self.in_string = true,
                b'{' | b'[' => self.depth += 1,
                b'}' | b']' => {
                    self.depth -= 1;
                    if self.depth == 0 {
                        each(&self.buf[self.start..self.pos])?;
                        self.start = self.pos;
                    }
                }
                _ => {}
            }
        }
        // Only once an object is done: an event arriving in many pieces is not moved each time.
        if self.start > 0 {
            self.buf.drain(..self.start);
            self.pos -= self.start;
            self.start = 0;
        }
        Ok(())
    }
}

/// A JSON object's members in order, each value as it came.
struct Fields<'a>(Vec<(String, &'a RawValue)>);

impl<'a> Fields<'a> {
    fn get(&self, key: &str) -> Option<&'a RawValue> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| *v)
    }

    fn string(&self, key: &str) -> Option<String> {
        self.get(key)
            .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
    }

    /// The object again without the members `keys`.
    fn write_without(&self, keys: &[&str]) -> Vec<u8> {
        Fields(
            self.0
                .iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .cloned()
                .collect(),
        )
        .write_with(&[])
    }

    /// The object again, with the values of `replace` in place of its own (added at the end
    /// when it had none).
    fn write_with(&self, replace: &[(&str, &str)]) -> Vec<u8> {
        let mut out = Vec::with_capacity(
            self.0
                .iter()
                .map(|(k, v)| k.len() + v.get().len() + 4)
                .sum(),
        );
        out.push(b'{');
        let member = |out: &mut Vec<u8>, k: &str, v: &str| {
            if out.len() > 1 {
                out.push(b',');
            }
            out.extend_from_slice(
                serde_json::to_string(k)
                    .unwrap_or_else(|_| "\"\"".into())
                    .as_bytes(),
            );
            out.push(b':');
            out.extend_from_slice(v.as_bytes());
        };
        for (k, v) in &self.0 {
            let v = replace
                .iter()
                .find(|(rk, _)| rk == k)
                .map_or(v.get(), |(_, rv)| *rv);
            member(&mut out, k, v);
        }
        for (rk, rv) in replace {
            if self.get(rk).is_none() {
                member(&mut out, rk, rv);
            }
        }
        out.push(b'}');
        out
    }
}

impl<'de: 'a, 'a> Deserialize<'de> for Fields<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<'a>(std::marker::PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for V<'a> {
            type Value = Fields<'a>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<M: MapAccess<'de>>(self, mut map: M) -> Result<Fields<'a>, M::Error> {
                let mut out: Vec<(String, &'a RawValue)> = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    // A member named twice could be read two ways: refused.
                    if out.iter().any(|(seen, _)| *seen == k) {
                        return Err(serde::de::Error::custom(format!("{k:?} appears twice")));
                    }
                    out.push((k, v));
                }
                Ok(Fields(out))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

#[cfg(test)]
mod tests;
