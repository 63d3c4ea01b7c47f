//! Roles: the YAML resource admins write, the presets created on first start, template
//! expansion with a user's traits, and the evaluator every door asks.
//!
//! Evaluation is a pure function of (identity traits, roles, resource): no I/O, no clock.
//! Matchers (globs, regular expressions) are compiled once when a [`RoleSet`] is built.
//! Deny always beats allow.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::duration::HumanDuration;
use crate::identity::Traits;

pub const DEFAULT_SESSION_TTL: Duration = Duration::from_secs(12 * 3600);

/// A role resource as written in YAML.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Role {
    pub kind: String,
    pub version: String,
    pub metadata: Metadata,
    #[serde(default)]
    pub spec: RoleSpec,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Metadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSpec {
    #[serde(default)]
    pub options: RoleOptions,
    #[serde(default)]
    pub allow: Conditions,
    #[serde(default)]
    pub deny: Conditions,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleOptions {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_session_ttl: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port_forwarding: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forward_agent: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub permit_x11_forwarding: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh_file_copy: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_idle_timeout: Option<HumanDuration>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnect_expired_cert: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_sessions: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_session: Option<RecordSession>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RecordSession {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ssh: Option<RecordMode>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<RecordMode>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RecordMode {
    BestEffort,
    Strict,
}

/// One side (allow or deny) of a role.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Conditions {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub logins: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, LabelValues>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_groups: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_users: Vec<String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kubernetes_labels: BTreeMap<String, LabelValues>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_resources: Vec<KubeResource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Accepted so that roles written for moderated sessions load; not enforced yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub join_sessions: Vec<serde_json::Value>,
}

/// A label value: one string or a list of alternatives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum LabelValues {
    One(String),
    Many(Vec<String>),
}

impl LabelValues {
    pub fn values(&self) -> &[String] {
        match self {
            LabelValues::One(v) => std::slice::from_ref(v),
            LabelValues::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeResource {
    pub kind: String,
    #[serde(default = "star")]
    pub namespace: String,
    #[serde(default = "star")]
    pub name: String,
    #[serde(default)]
    pub verbs: Vec<String>,
}

fn star() -> String {
    "*".into()
}

/// An admin API permission: verbs on kinds of resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub resources: Vec<String>,
    pub verbs: Vec<String>,
}

pub const RULE_RESOURCES: &[&str] = &[
    "role",
    "user",
    "token",
    "node",
    "session",
    "event",
    "connector",
    "lock",
    "cluster_auth_preference",
    "cluster",
    "kube_cluster",
    "*",
];
pub const RULE_VERBS: &[&str] = &["list", "read", "create", "update", "delete", "*"];
pub const KUBE_VERBS: &[&str] = &[
    "get",
    "list",
    "watch",
    "create",
    "update",
    "patch",
    "delete",
    "exec",
    "portforward",
    "*",
];

/// What is wrong with a role, for the admin who wrote it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("role {role:?}: {field}: {message}")]
pub struct RoleError {
    pub role: String,
    pub field: String,
    pub message: String,
}

impl Role {
    /// Checks everything serde cannot: kind and version, names, verbs, resources, patterns.
    pub fn validate(&self) -> Result<(), RoleError> {
        let name = self.metadata.name.clone();
        let err = |field: &str, message: String| RoleError {
            role: name.clone(),
            field: field.to_string(),
            message,
        };
        if self.kind != "role" {
            return Err(err("kind", format!("expected `role`, got {:?}", self.kind)));
        }
        if self.version != "v1" {
            return Err(err(
                "version",
                format!("expected `v1`, got {:?}", self.version),
            ));
        }
        crate::names::validate("role", &self.metadata.name)
            .map_err(|e| err("metadata.name", e.to_string()))?;
        for (side, c) in [("allow", &self.spec.allow), ("deny", &self.spec.deny)] {
            for (field, labels) in [
                ("node_labels", &c.node_labels),
                ("kubernetes_labels", &c.kubernetes_labels),
            ] {
                for (k, vs) in labels {
                    for v in vs.values() {
                        LabelMatcher::compile(v)
                            .map_err(|e| err(&format!("spec.{side}.{field}.{k}"), e))?;
                    }
                }
            }
            for (i, r) in c.rules.iter().enumerate() {
                for res in &r.resources {
                    if !RULE_RESOURCES.contains(&res.as_str()) {
                        return Err(err(
                            &format!("spec.{side}.rules[{i}].resources"),
                            format!(
                                "unknown resource {res:?} (one of {})",
                                RULE_RESOURCES.join(", ")
                            ),
                        ));
                    }
                }
                for v in &r.verbs {
                    if !RULE_VERBS.contains(&v.as_str()) {
                        return Err(err(
                            &format!("spec.{side}.rules[{i}].verbs"),
                            format!("unknown verb {v:?} (one of {})", RULE_VERBS.join(", ")),
                        ));
                    }
                }
            }
            for (i, r) in c.kubernetes_resources.iter().enumerate() {
                for v in &r.verbs {
                    if !KUBE_VERBS.contains(&v.as_str()) {
                        return Err(err(
                            &format!("spec.{side}.kubernetes_resources[{i}].verbs"),
                            format!("unknown verb {v:?} (one of {})", KUBE_VERBS.join(", ")),
                        ));
                    }
                }
                for (f, pat) in [
                    ("kind", &r.kind),
                    ("namespace", &r.namespace),
                    ("name", &r.name),
                ] {
                    LabelMatcher::compile(pat).map_err(|e| {
                        err(&format!("spec.{side}.kubernetes_resources[{i}].{f}"), e)
                    })?;
                }
            }
            for l in &c.logins {
                template::parse(l).map_err(|e| err(&format!("spec.{side}.logins"), e))?;
            }
        }
        Ok(())
    }
}

/// The roles created on first start.
pub fn presets() -> Vec<Role> {
    let role = |name: &str, description: &str, spec: RoleSpec| Role {
        kind: "role".into(),
        version: "v1".into(),
        metadata: Metadata {
            name: name.into(),
            description: Some(description.into()),
            labels: BTreeMap::new(),
        },
        spec,
    };
    let all_labels = || BTreeMap::from([("*".to_string(), LabelValues::One("*".into()))]);
    let rule = |resources: &[&str], verbs: &[&str]| Rule {
        resources: resources.iter().map(|s| s.to_string()).collect(),
        verbs: verbs.iter().map(|s| s.to_string()).collect(),
    };
    vec![
        role(
            "access",
            "reach every node as the user's own logins",
            RoleSpec {
                options: RoleOptions {
                    port_forwarding: Some(true),
                    forward_agent: Some(true),
                    ..Default::default()
                },
                allow: Conditions {
                    logins: vec!["{{internal.logins}}".into()],
                    node_labels: all_labels(),
                    kubernetes_groups: vec!["{{internal.kubernetes_groups}}".into()],
                    kubernetes_users: vec!["{{internal.kubernetes_users}}".into()],
                    kubernetes_labels: all_labels(),
                    rules: vec![rule(&["session"], &["list", "read"])],
                    ..Default::default()
                },
                deny: Conditions::default(),
            },
        ),
        role(
            "editor",
            "administer everything",
            RoleSpec {
                allow: Conditions {
                    rules: vec![rule(&["*"], &["*"])],
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
        role(
            "auditor",
            "read sessions and audit events",
            RoleSpec {
                allow: Conditions {
                    rules: vec![rule(&["session", "event"], &["list", "read"])],
                    ..Default::default()
                },
                ..Default::default()
            },
        ),
    ]
}

/// Matches one label value (or resource name): `*`, a glob, or a `^...$` regular expression.
#[derive(Debug, Clone)]
pub enum LabelMatcher {
    Any,
    Exact(String),
    Pattern(Regex),
}

impl LabelMatcher {
    pub fn compile(pattern: &str) -> Result<Self, String> {
        if pattern == "*" {
            return Ok(LabelMatcher::Any);
        }
        if pattern.starts_with('^') && pattern.ends_with('$') {
            return Regex::new(pattern)
                .map(LabelMatcher::Pattern)
                .map_err(|e| format!("bad regular expression {pattern:?}: {e}"));
        }
        if pattern.contains('*') {
            let parts: Vec<String> = pattern.split('*').map(regex::escape).collect();
            return Regex::new(&format!("^{}$", parts.join(".*")))
                .map(LabelMatcher::Pattern)
                .map_err(|e| format!("bad glob {pattern:?}: {e}"));
        }
        Ok(LabelMatcher::Exact(pattern.to_string()))
    }

    pub fn matches(&self, value: &str) -> bool {
        match self {
            LabelMatcher::Any => true,
            LabelMatcher::Exact(v) => v == value,
            LabelMatcher::Pattern(re) => re.is_match(value),
        }
    }
}

/// A compiled label selector: keys ANDed, the values of one key ORed.
#[derive(Debug, Clone, Default)]
pub struct LabelSelector {
    /// `None` key is the `'*': '*'` wildcard.
    terms: Vec<(Option<String>, Vec<LabelMatcher>)>,
    source: BTreeMap<String, Vec<String>>,
}

impl LabelSelector {
    fn compile(labels: &BTreeMap<String, Vec<String>>) -> Self {
        let terms = labels
            .iter()
            .map(|(k, vs)| {
                let key = if k == "*" { None } else { Some(k.clone()) };
                let matchers = vs
                    .iter()
                    .filter_map(|v| LabelMatcher::compile(v).ok())
                    .collect();
                (key, matchers)
            })
            .collect();
        LabelSelector {
            terms,
            source: labels.clone(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.terms.is_empty()
    }

    /// True when every key matches; an empty selector matches nothing.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        if self.terms.is_empty() {
            return false;
        }
        self.terms.iter().all(|(key, matchers)| match key {
            None => matchers.iter().any(|m| matches!(m, LabelMatcher::Any)),
            Some(k) => labels
                .get(k)
                .is_some_and(|v| matchers.iter().any(|m| m.matches(v))),
        })
    }

    /// `env=staging|dev, team=*` for explanations.
    pub fn describe(&self) -> String {
        self.source
            .iter()
            .map(|(k, vs)| format!("{k}={}", vs.join("|")))
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Template expansion of `{{internal.x}}`, `{{external.x}}`, `{{email.local(...)}}` and
/// `{{regexp.replace(..., "re", "repl")}}` inside role values.
pub mod template {
    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    pub enum Expr {
        Literal(String),
        Trait {
            prefix: String,
            name: String,
            func: Func,
            suffix: String,
        },
    }

    #[derive(Debug, Clone, PartialEq)]
    pub enum Func {
        None,
        EmailLocal,
        RegexpReplace(String, String),
    }

    /// Parses one value; a value without `{{` is a literal.
    pub fn parse(value: &str) -> Result<Expr, String> {
        let Some(start) = value.find("{{") else {
            return Ok(Expr::Literal(value.to_string()));
        };
        let end = value[start..]
            .find("}}")
            .map(|e| e + start)
            .ok_or_else(|| format!("unterminated template in {value:?}"))?;
        let prefix = value[..start].to_string();
        let suffix = value[end + 2..].to_string();
        if suffix.contains("{{") {
            return Err(format!("only one template per value: {value:?}"));
        }
        let inner = value[start + 2..end].trim();
        let (name, func) = if let Some(arg) = inner
            .strip_prefix("email.local(")
            .and_then(|s| s.strip_suffix(')'))
        {
            (arg.trim().to_string(), Func::EmailLocal)
        } else if let Some(args) = inner
            .strip_prefix("regexp.replace(")
            .and_then(|s| s.strip_suffix(')'))
        {
            let (name, re, repl) = parse_replace_args(args).ok_or_else(|| {
                format!("regexp.replace takes (trait, \"regexp\", \"replacement\"): {value:?}")
            })?;
            Regex::new(&re).map_err(|e| format!("bad regular expression {re:?}: {e}"))?;
            (name, Func::RegexpReplace(re, repl))
        } else {
            (inner.to_string(), Func::None)
        };
        if !(name.starts_with("internal.") || name.starts_with("external.")) || name.len() <= 9 {
            return Err(format!(
                "unknown trait namespace in {value:?}: use internal.<name> or external.<claim>"
            ));
        }
        Ok(Expr::Trait {
            prefix,
            name,
            func,
            suffix,
        })
    }

    fn parse_replace_args(args: &str) -> Option<(String, String, String)> {
        let (name, rest) = args.split_once(',')?;
        let rest = rest.trim();
        let (re, rest) = quoted(rest)?;
        let rest = rest.trim().strip_prefix(',')?.trim();
        let (repl, rest) = quoted(rest)?;
        rest.trim()
            .is_empty()
            .then(|| (name.trim().to_string(), re, repl))
    }

    fn quoted(s: &str) -> Option<(String, &str)> {
        let s = s.strip_prefix('"')?;
        let end = s.find('"')?;
        Some((s[..end].to_string(), &s[end + 1..]))
    }

    /// Expands a value against traits. An empty expansion yields no values.
    pub fn expand(value: &str, traits: &Traits) -> Vec<String> {
        let Ok(expr) = parse(value) else {
            return Vec::new();
        };
        match expr {
            Expr::Literal(v) => vec![v],
            Expr::Trait {
                prefix,
                name,
                func,
                suffix,
            } => {
                let values = traits.get(&name).map(Vec::as_slice).unwrap_or(&[]);
                values
                    .iter()
                    .filter_map(|v| {
                        let v = match &func {
                            Func::None => Some(v.clone()),
                            Func::EmailLocal => v.split_once('@').map(|(l, _)| l.to_string()),
                            Func::RegexpReplace(re, repl) => {
                                let re = Regex::new(re).ok()?;
                                re.is_match(v)
                                    .then(|| re.replace(v, repl.as_str()).into_owned())
                            }
                        }?;
                        (!v.is_empty()).then(|| format!("{prefix}{v}{suffix}"))
                    })
                    .collect()
            }
        }
    }
}

/// A role with its templates expanded for one identity and its matchers compiled.
#[derive(Debug, Clone)]
struct CompiledRole {
    name: String,
    options: RoleOptions,
    allow: CompiledConditions,
    deny: CompiledConditions,
}

#[derive(Debug, Clone, Default)]
struct CompiledConditions {
    logins: BTreeSet<String>,
    node_labels: LabelSelector,
    rules: Vec<Rule>,
}

impl CompiledConditions {
    fn compile(c: &Conditions, traits: &Traits) -> Self {
        let logins = c
            .logins
            .iter()
            .flat_map(|l| template::expand(l, traits))
            .collect();
        let node_labels = c
            .node_labels
            .iter()
            .map(|(k, vs)| {
                let values = vs
                    .values()
                    .iter()
                    .flat_map(|v| template::expand(v, traits))
                    .collect();
                (k.clone(), values)
            })
            .collect();
        CompiledConditions {
            logins,
            node_labels: LabelSelector::compile(&node_labels),
            rules: c.rules.clone(),
        }
    }
}

/// The outcome of an access check, with the role and rule that decided it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Decision {
    pub allowed: bool,
    pub explanation: String,
}

impl Decision {
    fn allow(explanation: String) -> Self {
        Decision {
            allowed: true,
            explanation,
        }
    }
    fn deny(explanation: String) -> Self {
        Decision {
            allowed: false,
            explanation,
        }
    }
}

/// All the roles one identity holds, ready to answer access questions.
#[derive(Debug, Clone)]
pub struct RoleSet {
    roles: Vec<CompiledRole>,
}

impl RoleSet {
    pub fn new(roles: &[Role], traits: &Traits) -> Self {
        let roles = roles
            .iter()
            .map(|r| CompiledRole {
                name: r.metadata.name.clone(),
                options: r.spec.options.clone(),
                allow: CompiledConditions::compile(&r.spec.allow, traits),
                deny: CompiledConditions::compile(&r.spec.deny, traits),
            })
            .collect();
        RoleSet { roles }
    }

    pub fn names(&self) -> Vec<String> {
        self.roles.iter().map(|r| r.name.clone()).collect()
    }

    /// Logins any role allows and no role denies: the principals of a user certificate.
    pub fn logins(&self) -> Vec<String> {
        let denied: BTreeSet<&String> = self.roles.iter().flat_map(|r| &r.deny.logins).collect();
        let allowed: BTreeSet<&String> = self.roles.iter().flat_map(|r| &r.allow.logins).collect();
        allowed
            .into_iter()
            .filter(|l| !denied.contains(l))
            .cloned()
            .collect()
    }

    /// The shortest `max_session_ttl` of any role (default 12h).
    pub fn max_session_ttl(&self) -> Duration {
        self.roles
            .iter()
            .filter_map(|r| r.options.max_session_ttl.map(|d| d.0))
            .min()
            .unwrap_or(DEFAULT_SESSION_TTL)
    }

    pub fn port_forwarding(&self) -> bool {
        self.roles
            .iter()
            .any(|r| r.options.port_forwarding == Some(true))
    }

    pub fn forward_agent(&self) -> bool {
        self.roles
            .iter()
            .any(|r| r.options.forward_agent == Some(true))
    }

    pub fn permit_x11_forwarding(&self) -> bool {
        self.roles
            .iter()
            .any(|r| r.options.permit_x11_forwarding == Some(true))
    }

    /// May this identity `verb` a `resource` of the admin API? Deny rules win.
    pub fn check_rule(&self, resource: &str, verb: &str) -> Decision {
        let hit = |rules: &[Rule]| {
            rules.iter().any(|r| {
                r.resources.iter().any(|x| x == "*" || x == resource)
                    && r.verbs.iter().any(|v| v == "*" || v == verb)
            })
        };
        if let Some(r) = self.roles.iter().find(|r| hit(&r.deny.rules)) {
            return Decision::deny(format!("role {} denies `{verb}` on `{resource}`", r.name));
        }
        if let Some(r) = self.roles.iter().find(|r| hit(&r.allow.rules)) {
            return Decision::allow(format!("role {} allows `{verb}` on `{resource}`", r.name));
        }
        let names = self.names().join(", ");
        Decision::deny(format!(
            "role {} lacks `{verb}` on `{resource}`",
            if names.is_empty() {
                "(none)".into()
            } else {
                names
            }
        ))
    }

    /// May this identity log in as `login` on a node with these labels? Deny beats allow.
    pub fn check_node(&self, login: &str, labels: &BTreeMap<String, String>) -> Decision {
        for r in &self.roles {
            if r.deny.logins.contains(login) {
                return Decision::deny(format!("role {} denies login {login}", r.name));
            }
            if !r.deny.node_labels.is_empty() && r.deny.node_labels.matches(labels) {
                return Decision::deny(format!(
                    "role {} denies nodes with labels {}",
                    r.name,
                    r.deny.node_labels.describe()
                ));
            }
        }
        let mut login_ok = None;
        for r in &self.roles {
            if r.allow.logins.contains(login) {
                login_ok.get_or_insert(&r.name);
                if r.allow.node_labels.matches(labels) {
                    return Decision::allow(format!(
                        "role {} allows login {login} on nodes with labels {}",
                        r.name,
                        r.allow.node_labels.describe()
                    ));
                }
            }
        }
        match login_ok {
            Some(_) => Decision::deny(format!(
                "no role allows login {login} on a node with these labels"
            )),
            None => Decision::deny(format!("no role allows login {login}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::identity::internal_traits;

    fn traits(logins: &[&str]) -> Traits {
        let logins: Vec<String> = logins.iter().map(|s| s.to_string()).collect();
        internal_traits(&logins, &[], &[])
    }

    #[test]
    fn presets_validate() {
        for r in presets() {
            r.validate()
                .map_err(|e| e.to_string())
                .unwrap_or_else(|e| panic!("{e}"));
        }
    }

    #[test]
    fn access_preset_expands_logins() {
        let set = RoleSet::new(&presets()[..1], &traits(&["root", "ubuntu"]));
        assert_eq!(set.logins(), vec!["root", "ubuntu"]);
        assert_eq!(set.max_session_ttl(), DEFAULT_SESSION_TTL);
        assert!(set.port_forwarding());
    }

    #[test]
    fn rules() {
        let p = presets();
        let editor = RoleSet::new(&p[1..2], &Traits::new());
        assert!(editor.check_rule("role", "create").allowed);
        let auditor = RoleSet::new(&p[2..3], &Traits::new());
        assert!(auditor.check_rule("event", "list").allowed);
        let d = auditor.check_rule("role", "create");
        assert!(!d.allowed);
        assert_eq!(d.explanation, "role auditor lacks `create` on `role`");
    }

    #[test]
    fn templates() {
        let mut t = Traits::new();
        t.insert("external.email".into(), vec!["alice@example.com".into()]);
        t.insert(
            "external.groups".into(),
            vec!["team-db".into(), "admins".into()],
        );
        assert_eq!(
            template::expand("{{email.local(external.email)}}", &t),
            vec!["alice"]
        );
        assert_eq!(
            template::expand(
                r#"{{regexp.replace(external.groups, "^team-(.*)$", "$1")}}"#,
                &t
            ),
            vec!["db"]
        );
        assert_eq!(
            template::expand("{{external.missing}}", &t),
            Vec::<String>::new()
        );
        assert_eq!(
            template::expand("x-{{external.email}}", &t),
            vec!["x-alice@example.com"]
        );
        assert!(template::parse("{{bogus.x}}").is_err());
    }
}
