//! Kubernetes access, the pure parts every side shares: the certificate extension that names a
//! kubeconfig certificate's cluster, how a request path reads as (verb, kind, namespace, name)
//! for the role evaluator, which principals a request may impersonate, and the `metav1.Status`
//! bodies kubectl understands.
//!
//! Architecture invariant: the door decides on the path the API server will see. A path that
//! could be read two ways (`..`, `.`, `//`, an encoded `/`, `\` or `.`) is refused before any
//! decision, so the classification here is the API server's.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// The extension a kubeconfig certificate carries (1.3.9999.71.1: a private arc, as Teleport
/// uses 1.3.9999.1.x). Non-critical: webpki refuses certificates with unknown critical ones.
pub const CERT_EXTENSION_OID: &[u64] = &[1, 3, 9999, 71, 1];

/// What the extension says: the one cluster this certificate opens, and the principals the
/// roles gave when it was issued (informational: the door recomputes them on every request).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeCertExt {
    pub kube_cluster: String,
    #[serde(default)]
    pub kube_users: Vec<String>,
    #[serde(default)]
    pub kube_groups: Vec<String>,
}

impl KubeCertExt {
    /// The extension's value: a DER UTF8String holding the JSON.
    pub fn to_der(&self) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut out = vec![0x0c];
        der_length(json.len(), &mut out);
        out.extend_from_slice(&json);
        out
    }

    /// Reads the extension from a certificate (DER); none when it has no such extension or it
    /// does not parse.
    pub fn from_cert(cert_der: &[u8]) -> Option<Self> {
        use x509_parser::prelude::{FromDer, X509Certificate};
        let (_, cert) = X509Certificate::from_der(cert_der).ok()?;
        let want = x509_parser::der_parser::oid::Oid::from(CERT_EXTENSION_OID).ok()?;
        let ext = cert.extensions().iter().find(|e| e.oid == want)?;
        let body = der_utf8(ext.value)?;
        serde_json::from_slice(body).ok()
    }
}

fn der_length(len: usize, out: &mut Vec<u8>) {
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes = len.to_be_bytes();
        let skip = bytes.iter().take_while(|b| **b == 0).count();
        out.push(0x80 | (bytes.len() - skip) as u8);
        out.extend_from_slice(&bytes[skip..]);
    }
}

fn der_utf8(v: &[u8]) -> Option<&[u8]> {
    let (&tag, rest) = v.split_first()?;
    if tag != 0x0c {
        return None;
    }
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (first as usize, rest)
    } else {
        let n = (first & 0x7f) as usize;
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |a, b| (a << 8) | *b as usize);
        (len, &rest[n..])
    };
    (rest.len() == len).then_some(rest)
}

/// One `kubectl exec` or `attach`, as the door read it and auth granted it: what the kube
/// agent runs (from its per-session certificate, `sshcert::EXT_KUBE_EXEC`) and what the
/// session's audit and recording say.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KubeExec {
    pub namespace: String,
    pub pod: String,
    /// Empty: the pod's default container (the API server picks it).
    #[serde(default)]
    pub container: String,
    /// `exec` or `attach`.
    pub subresource: String,
    /// The command (exec); empty for attach.
    #[serde(default)]
    pub command: Vec<String>,
    pub tty: bool,
    pub stdin: bool,
    /// The principals impersonated.
    pub kube_user: String,
    #[serde(default)]
    pub kube_groups: Vec<String>,
    /// The client's stream protocol (`v5.channel.k8s.io`, ...).
    #[serde(default)]
    pub protocol: String,
}

impl KubeExec {
    /// The command as one line, for the recording's header and the audit log.
    pub fn command_line(&self) -> String {
        if self.subresource == "attach" {
            return format!("attach {}/{}", self.namespace, self.pod);
        }
        self.command.join(" ")
    }
}

/// Kinds that live outside namespaces: a rule's `namespace` does not apply to them.
pub fn cluster_wide(kind: &str) -> bool {
    matches!(
        kind,
        "namespace" | "node" | "persistentvolume" | "clusterrole" | "clusterrolebinding"
    )
}

/// The role vocabulary's kind for a resource of an API group (`""` the core group); none for
/// a kind outside it (a custom resource, which only `kind: '*'` matches).
pub fn vocabulary_kind(group: &str, resource: &str) -> Option<&'static str> {
    Some(match (group, resource) {
        ("", "pods") => "pod",
        ("", "services") => "service",
        ("", "configmaps") => "configmap",
        ("", "secrets") => "secret",
        ("", "namespaces") => "namespace",
        ("", "nodes") => "node",
        ("", "persistentvolumes") => "persistentvolume",
        ("", "persistentvolumeclaims") => "persistentvolumeclaim",
        ("", "serviceaccounts") => "serviceaccount",
        ("apps", "deployments") => "deployment",
        ("apps", "statefulsets") => "statefulset",
        ("apps", "daemonsets") => "daemonset",
        ("apps", "replicasets") => "replicaset",
        ("batch", "jobs") => "job",
        ("batch", "cronjobs") => "cronjob",
        ("networking.k8s.io", "ingresses") => "ingress",
        ("rbac.authorization.k8s.io", "roles") => "role",
        ("rbac.authorization.k8s.io", "rolebindings") => "rolebinding",
        ("rbac.authorization.k8s.io", "clusterroles") => "clusterrole",
        ("rbac.authorization.k8s.io", "clusterrolebindings") => "clusterrolebinding",
        _ => return None,
    })
}

/// A request path the door refuses to read (400).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct BadPath(pub String);

/// A Kubernetes request as the roles see it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Classified {
    /// Discovery (`/api`, `/apis/...` without a resource, `/version`, `/openapi/...`): open to
    /// everyone who reaches the cluster.
    pub discovery: bool,
    pub group: String,
    /// The plural resource as in the path (`pods`), empty for a non-resource URL.
    pub resource: String,
    /// The role vocabulary's kind (`pod`), or the resource itself for one outside it.
    pub kind: String,
    pub namespace: String,
    pub name: String,
    pub subresource: String,
    pub verb: &'static str,
}

impl Classified {
    pub fn request(&self) -> crate::role::KubeRequest<'_> {
        crate::role::KubeRequest {
            kind: &self.kind,
            namespace: &self.namespace,
            name: &self.name,
            verb: self.verb,
        }
    }

    /// exec or attach: an interactive stream the session engine records.
    pub fn is_exec(&self) -> bool {
        self.resource == "pods" && matches!(self.subresource.as_str(), "exec" | "attach")
    }

    pub fn is_portforward(&self) -> bool {
        self.resource == "pods" && self.subresource == "portforward"
    }
}

/// Checks a path (what follows `/kube/CLUSTER`) for anything read two ways.
pub fn check_path(path: &str) -> Result<(), BadPath> {
    if !path.starts_with('/') {
        return Err(BadPath("the path must start with /".into()));
    }
    if path.len() > MAX_PATH {
        return Err(BadPath(format!(
            "the path is {} bytes long; the most this door reads is {MAX_PATH}",
            path.len()
        )));
    }
    if path.contains('\\') {
        return Err(BadPath(format!(
            "the path {path:?} contains a backslash, which the API server could read another way"
        )));
    }
    if path.len() > 1 {
        let segs: Vec<&str> = path[1..].split('/').collect();
        // The API server decodes the path before it reads it (`%73ecrets` is `secrets`), and
        // no name, namespace or resource ever needs encoding: a `%` is refused wherever the
        // door decides, and allowed only in a proxy subresource's own path, which it does not.
        let decided = match segs.iter().position(|s| *s == "proxy") {
            Some(i) if proxied(&segs[..=i]) => &segs[..=i],
            _ => &segs[..],
        };
        if decided.iter().any(|s| s.contains('%')) {
            return Err(BadPath(format!(
                "the path {path:?} is percent-encoded where the API server would decode it; send it as the API server reads it"
            )));
        }
        let last = segs.len() - 1;
        for (i, seg) in segs.iter().enumerate() {
            // A trailing slash is a proxy path's own (`pods/NAME/proxy/`), nothing else's.
            let trailing = i == last && i > 0;
            if (seg.is_empty() && !(trailing && proxied(&segs))) || *seg == "." || *seg == ".." {
                return Err(BadPath(format!(
                    "the path {path:?} has an empty, `.` or `..` segment"
                )));
            }
        }
    }
    Ok(())
}

/// Is this (split) path under a `proxy` subresource (`.../pods/NAME/proxy/...`)?
fn proxied(segs: &[&str]) -> bool {
    segs.windows(3).any(|w| {
        matches!(w[0], "pods" | "services" | "nodes") && !w[1].is_empty() && w[2] == "proxy"
    })
}

/// The longest path the door reads (a real one is under a few hundred bytes; every request's
/// path goes into the audit log).
pub const MAX_PATH: usize = 4096;

/// Is `key` set in the query as the API server reads it: keys and values decoded, and any value
/// but `0` or `false` (any case) is true. Stricter than the API server where they differ: a
/// `watch` the door misreads is decided as a watch, never as a list.
fn query_flag(query: &str, key: &str) -> bool {
    url::form_urlencoded::parse(query.as_bytes())
        .any(|(k, v)| k.eq_ignore_ascii_case(key) && v != "0" && !v.eq_ignore_ascii_case("false"))
}

/// Reads `method path?query` as the API server would: verb, kind, namespace, name.
pub fn classify(method: &str, path: &str, query: &str) -> Result<Classified, BadPath> {
    check_path(path)?;
    let segs: Vec<&str> = path[1..].split('/').filter(|s| !s.is_empty()).collect();
    let mut c = Classified {
        verb: "get",
        ..Default::default()
    };
    let (group, rest): (&str, &[&str]) = match segs.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (group, rest),
        // /api, /api/v1 … handled below as discovery; everything else is a non-resource URL.
        _ => ("", &[][..]),
    };
    let is_resource_path = matches!(segs.as_slice(), ["api", _, _, ..] | ["apis", _, _, _, ..]);
    if !is_resource_path {
        let discovery = matches!(
            segs.as_slice(),
            [] | ["api"] | ["api", _] | ["apis"] | ["apis", _] | ["apis", _, _] | ["version"]
        ) || segs.first() == Some(&"openapi");
        c.discovery = discovery && method == "GET";
        c.verb = verb_of(method, true, false, false);
        // A non-resource URL other than discovery is matched by `kind: '*'` only.
        c.kind = segs.join("/");
        return Ok(c);
    }
    c.group = group.to_string();
    let mut rest = rest;
    let mut watch_path = false;
    if rest.first() == Some(&"watch") {
        watch_path = true;
        rest = &rest[1..];
    }
    // namespaces/NS/RESOURCE/... or namespaces/NS (the namespace itself), but namespaces/NS/status
    // and /finalize are the namespace's own subresources.
    let namespace_sub = matches!(rest, ["namespaces", _, "status" | "finalize"]);
    if rest.first() == Some(&"namespaces") && rest.len() >= 3 && !namespace_sub {
        c.namespace = rest[1].to_string();
        rest = &rest[2..];
    }
    let (resource, name, sub) = match rest {
        [resource] => (*resource, "", ""),
        [resource, name] => (*resource, *name, ""),
        [resource, name, sub] => (*resource, *name, *sub),
        // `.../pods/NAME/proxy/PATH`: the pod's own path is the API server's to pass on; the
        // decision is the proxy subresource's (verb `proxy`).
        [resource, name, "proxy", ..] => (*resource, *name, "proxy"),
        _ => {
            return Err(BadPath(format!(
                "the path {path:?} is not a Kubernetes resource path"
            )));
        }
    };
    c.resource = resource.to_string();
    c.name = name.to_string();
    c.subresource = sub.to_string();
    c.kind = match vocabulary_kind(group, resource) {
        Some(k) => k.to_string(),
        // Outside the vocabulary: only `kind: '*'` matches, so the exact word is kept for the
        // explanation and the audit record.
        None if group.is_empty() => resource.to_string(),
        None => format!("{resource}.{group}"),
    };
    // The namespace object: its own name is the namespace rules speak of.
    if c.kind == "namespace" && c.namespace.is_empty() {
        c.namespace = c.name.clone();
    }
    let watch = watch_path || query_flag(query, "watch");
    c.verb = match (c.resource.as_str(), sub) {
        ("pods", "exec" | "attach") => "exec",
        ("pods", "portforward") => "portforward",
        // HTTP into a pod or service: a verb of its own, never the parent's `get`.
        ("pods" | "services", "proxy") => "proxy",
        // The kubelet's own API (`/run`, `/exec`): root on the node, never through the door.
        ("nodes", "proxy") => {
            return Err(BadPath(
                "nodes/NAME/proxy reaches the kubelet's own API, which this proxy never passes on"
                    .into(),
            ));
        }
        _ => verb_of(method, !c.name.is_empty(), watch, true),
    };
    Ok(c)
}

fn verb_of(method: &str, named: bool, watch: bool, resource: bool) -> &'static str {
    match method {
        "GET" | "HEAD" if watch => "watch",
        "GET" | "HEAD" if named || !resource => "get",
        "GET" | "HEAD" => "list",
        "POST" => "create",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" if named || !resource => "delete",
        "DELETE" => "deletecollection",
        _ => "unknown",
    }
}

/// The group every authenticated Kubernetes user is in.
pub const AUTHENTICATED: &str = "system:authenticated";

/// Who the door impersonates for one request, or why it refuses (403).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Principals {
    pub user: String,
    pub groups: Vec<String>,
}

/// The `Impersonate-*` headers a client sent (kubectl `--as`, `--as-group`).
#[derive(Debug, Clone, Default)]
pub struct AskedImpersonation {
    pub users: Vec<String>,
    pub groups: Vec<String>,
    /// `Impersonate-Uid` or any `Impersonate-Extra-*`.
    pub other: Vec<String>,
}

/// Picks the principals for a request from what the roles allow (`users`, `groups`, for the
/// request) and what the client asked for. No `kubernetes_users` means the user's own name.
pub fn impersonate(
    username: &str,
    allowed_users: &[String],
    allowed_groups: &[String],
    asked: &AskedImpersonation,
) -> Result<Principals, String> {
    let denied = |why: String| format!("impersonation request has been denied, {why}");
    if let Some(h) = asked.other.first() {
        return Err(denied(format!("{h} is not supported")));
    }
    let asked_users: Vec<&String> = asked.users.iter().filter(|u| !u.is_empty()).collect();
    if asked_users.len() > 1 {
        return Err(denied("only one Impersonate-User may be given".into()));
    }
    let users: Vec<String> = if allowed_users.is_empty() {
        vec![username.to_string()]
    } else {
        allowed_users.to_vec()
    };
    let user = match asked_users.first() {
        Some(u) if users.contains(u) => (*u).clone(),
        Some(u) => {
            return Err(denied(format!(
                "user {u:?} is not one of the kubernetes_users your roles allow here"
            )));
        }
        None if users.len() == 1 => users[0].clone(),
        None => {
            return Err(denied(format!(
                "your roles allow several kubernetes_users here ({}); choose one with kubectl --as",
                users.join(", ")
            )));
        }
    };
    let mut groups: Vec<String> = if asked.groups.is_empty() {
        allowed_groups.to_vec()
    } else {
        for g in &asked.groups {
            if g != AUTHENTICATED && !allowed_groups.contains(g) {
                return Err(denied(format!(
                    "group {g:?} is not one of the kubernetes_groups your roles allow here"
                )));
            }
        }
        asked.groups.clone()
    };
    if !groups.iter().any(|g| g == AUTHENTICATED) {
        groups.push(AUTHENTICATED.to_string());
    }
    groups.dedup();
    Ok(Principals { user, groups })
}

/// A `metav1.Status` body: what kubectl prints for an error (without it, "unknown").
pub fn status(code: u16, reason: &str, message: &str) -> serde_json::Value {
    serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code,
    })
}

/// The reason word Kubernetes uses for an HTTP status.
pub fn reason_for(code: u16) -> &'static str {
    match code {
        400 => "BadRequest",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "NotFound",
        405 => "MethodNotAllowed",
        409 => "Conflict",
        413 => "RequestEntityTooLarge",
        429 => "TooManyRequests",
        503 => "ServiceUnavailable",
        504 => "Timeout",
        _ => "InternalError",
    }
}

/// Labels the roles see for a cluster: its own plus `kube_cluster: NAME`.
pub fn cluster_labels(name: &str, labels: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    let mut l = labels.clone();
    l.insert("kube_cluster".into(), name.to_string());
    l
}

#[cfg(test)]
mod tests;
