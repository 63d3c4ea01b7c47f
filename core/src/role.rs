//! Roles: the YAML resource admins write, the presets created on first start, template
//! expansion with a user's traits, and the evaluator every door asks.
//!
//! Evaluation is a pure function of (identity traits, roles, resource): no I/O, no clock.
//! Matchers (globs, regular expressions) are compiled once when a [`RoleSet`] is built.
//! Deny always beats allow.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Whether recordings also hold what the person typed (`i` events). Off unless a role
    /// asks: keystrokes include passwords typed at prompts that do not echo.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record_input: Option<bool>,
    /// Whether an agent creates a login this role allows that does not exist on the node
    /// (Teleport's host user creation). Off unless every role that allows the login there asks.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub create_host_user_mode: Option<HostUserMode>,
}

/// `create_host_user_mode`: `off`, `keep` (the created login stays after its sessions), or
/// `insecure-drop` (removed, with its home, when its last session on the node ends).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum HostUserMode {
    Off,
    Keep,
    InsecureDrop,
}

impl HostUserMode {
    pub fn as_str(self) -> &'static str {
        match self {
            HostUserMode::Off => "off",
            HostUserMode::Keep => "keep",
            HostUserMode::InsecureDrop => "insecure-drop",
        }
    }
}

/// A group name for `host_groups`, checked as `groupadd` would want it while the YAML is read
/// (the agent checks again: it runs `groupadd` and `useradd -G` with it as root).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct HostGroup(String);

impl HostGroup {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// True for a user or group name every shadow-utils accepts: a letter or `_`, then letters,
/// digits, `_`, `-` or `.`, at most 32 bytes. Never starts with `-` (no option injection).
pub fn valid_host_name(s: &str) -> bool {
    let mut chars = s.chars();
    s.len() <= 32
        && chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
}

impl TryFrom<String> for HostGroup {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if valid_host_name(&s) {
            Ok(HostGroup(s))
        } else {
            Err(format!(
                "bad host group {s:?}: a group name starts with a letter or `_` and has only letters, digits, `_`, `-` and `.`, at most 32 characters"
            ))
        }
    }
}

impl From<HostGroup> for String {
    fn from(g: HostGroup) -> String {
        g.0
    }
}

/// One `host_sudoers` entry, what follows the login's name on its line in the node's sudoers
/// drop-in (`ALL=(ALL) NOPASSWD: /usr/bin/true`). One line: a line break (or a trailing `\`,
/// which continues the line) would let one entry write others. Its syntax is `visudo -c`'s to
/// judge, on the node, before anything is installed.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct SudoersLine(String);

impl SudoersLine {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for SudoersLine {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.trim().is_empty() {
            Err("empty host_sudoers entry: write what follows the login's name on its sudoers line, e.g. `ALL=(ALL) NOPASSWD: /usr/bin/true`".into())
        } else if s.contains(['\n', '\r', '\0']) {
            Err(format!(
                "host_sudoers entry {s:?} has a line break: each entry is one sudoers line"
            ))
        } else if s.trim_end().ends_with('\\') {
            Err(format!(
                "host_sudoers entry {s:?} ends with `\\`, which would continue it on the next line"
            ))
        } else {
            Ok(SudoersLine(s))
        }
    }
}

impl From<SudoersLine> for String {
    fn from(l: SudoersLine) -> String {
        l.0
    }
}

/// What auth decided about creating a login on one node, for the agent (in the per-session
/// certificate) and for the audit log. Only ever `keep` or `insecure-drop`: `off` is no grant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostUser {
    pub mode: HostUserMode,
    #[serde(default)]
    pub groups: Vec<HostGroup>,
    #[serde(default)]
    pub sudoers: Vec<SudoersLine>,
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
    pub logins: Vec<Pattern>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub node_labels: BTreeMap<String, LabelValues>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_groups: Vec<Pattern>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_users: Vec<Pattern>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub kubernetes_labels: BTreeMap<String, LabelValues>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kubernetes_resources: Vec<KubeResource>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub rules: Vec<Rule>,
    /// Accepted so that roles written for moderated sessions load; not enforced yet.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub join_sessions: Vec<serde_json::Value>,
    /// Groups a login created on a node joins (created there when missing). On the deny side:
    /// groups no created login joins.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_groups: Vec<HostGroup>,
    /// Sudoers lines for a login created on a node. On the deny side: lines removed, `*` all.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host_sudoers: Vec<SudoersLine>,
}

/// A label value: one string or a list of alternatives.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(untagged)]
pub enum LabelValues {
    One(Pattern),
    Many(Vec<Pattern>),
}

// By hand rather than `untagged`, so that a bad pattern's own message (and its line and column)
// reaches the admin instead of "did not match any variant".
impl<'de> Deserialize<'de> for LabelValues {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = LabelValues;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a label value or a list of label values")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<LabelValues, E> {
                Pattern::try_from(v.to_string())
                    .map(LabelValues::One)
                    .map_err(E::custom)
            }
            fn visit_bool<E: serde::de::Error>(self, v: bool) -> Result<LabelValues, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<LabelValues, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<LabelValues, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(
                self,
                mut seq: A,
            ) -> Result<LabelValues, A::Error> {
                let mut out = Vec::new();
                while let Some(p) = seq.next_element::<Pattern>()? {
                    out.push(p);
                }
                Ok(LabelValues::Many(out))
            }
        }
        d.deserialize_any(V)
    }
}

impl LabelValues {
    pub fn values(&self) -> &[Pattern] {
        match self {
            LabelValues::One(v) => std::slice::from_ref(v),
            LabelValues::Many(v) => v,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KubeResource {
    pub kind: Word<KubeKind>,
    #[serde(default = "star")]
    pub namespace: Pattern,
    #[serde(default = "star")]
    pub name: Pattern,
    #[serde(default)]
    pub verbs: Vec<Word<KubeVerb>>,
}

fn star() -> Pattern {
    Pattern("*".into())
}

/// An admin API permission: verbs on kinds of resource.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rule {
    pub resources: Vec<Word<RuleResource>>,
    pub verbs: Vec<Word<RuleVerb>>,
}

/// A string that must be one of a fixed vocabulary, checked while the YAML is read so that a
/// typo is reported at its line and column.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Word<V: Vocabulary>(String, std::marker::PhantomData<V>);

pub trait Vocabulary: Clone {
    const WHAT: &'static str;
    const WORDS: &'static [&'static str];
}

impl<V: Vocabulary> Word<V> {
    pub fn as_str(&self) -> &str {
        &self.0
    }
    pub fn new(s: &str) -> Result<Self, String> {
        Self::try_from(s.to_string())
    }
}

impl<V: Vocabulary> TryFrom<String> for Word<V> {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if V::WORDS.contains(&s.as_str()) {
            Ok(Word(s, std::marker::PhantomData))
        } else {
            Err(format!(
                "unknown {} {s:?}: use one of {}",
                V::WHAT,
                V::WORDS.join(", ")
            ))
        }
    }
}

impl<V: Vocabulary> From<Word<V>> for String {
    fn from(w: Word<V>) -> String {
        w.0
    }
}

impl<V: Vocabulary> PartialEq<str> for Word<V> {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl<V: Vocabulary> PartialEq<&str> for Word<V> {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

macro_rules! vocabulary {
    ($name:ident, $what:literal, [$($w:literal),* $(,)?]) => {
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name;
        impl Vocabulary for $name {
            const WHAT: &'static str = $what;
            const WORDS: &'static [&'static str] = &[$($w),*];
        }
    };
}

vocabulary!(
    RuleResource,
    "resource",
    [
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
    ]
);
vocabulary!(
    RuleVerb,
    "verb",
    ["list", "read", "create", "update", "delete", "*"]
);
vocabulary!(
    KubeVerb,
    "kubernetes verb",
    [
        "get",
        "list",
        "watch",
        "create",
        "update",
        "patch",
        "delete",
        "deletecollection",
        "exec",
        "portforward",
        "proxy",
        "*",
    ]
);
vocabulary!(
    KubeKind,
    "kubernetes kind",
    [
        "pod",
        "service",
        "deployment",
        "statefulset",
        "daemonset",
        "replicaset",
        "job",
        "cronjob",
        "configmap",
        "secret",
        "namespace",
        "node",
        "persistentvolume",
        "persistentvolumeclaim",
        "serviceaccount",
        "ingress",
        "role",
        "rolebinding",
        "clusterrole",
        "clusterrolebinding",
        "*",
    ]
);

/// A label value, login or resource name as written: a literal, `*`, a glob, a `^...$`
/// regular expression, or a `{{...}}` template. Checked (and regexes compiled to check them)
/// while the YAML is read.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Pattern(String);

impl Pattern {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for Pattern {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        if s.contains("{{") {
            template::parse(&s)?;
        } else {
            LabelMatcher::compile(&s)?;
        }
        Ok(Pattern(s))
    }
}

impl From<Pattern> for String {
    fn from(p: Pattern) -> String {
        p.0
    }
}

impl From<&str> for Pattern {
    /// For literals in code; a bad pattern here is a programming error caught by the tests.
    fn from(s: &str) -> Self {
        Pattern(s.to_string())
    }
}

/// What is wrong with a role, for the admin who wrote it.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("role {role:?}: {field}: {message}")]
pub struct RoleError {
    pub role: String,
    pub field: String,
    pub message: String,
    /// The offending item of a list `field`, counted from 0.
    pub item: Option<usize>,
}

impl RoleError {
    /// Where the offending value is, as a dotted path (`spec.allow.logins.1`), for
    /// `yaml::Places::find`.
    pub fn path(&self) -> String {
        match self.item {
            Some(i) => format!("{}.{i}", self.field),
            None => self.field.clone(),
        }
    }
}

impl Role {
    /// Checks what the types cannot: kind, version and name. Everything else (verbs, resources,
    /// patterns, templates, durations) is checked while the YAML or JSON is read.
    pub fn validate(&self) -> Result<(), RoleError> {
        let err = |field: &str, message: String| RoleError {
            role: self.metadata.name.clone(),
            field: field.to_string(),
            message,
            item: None,
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
        if let Some((i, l)) = self
            .spec
            .allow
            .logins
            .iter()
            .enumerate()
            .find(|(_, l)| !l.as_str().contains("{{") && l.as_str().contains(['*', '^']))
        {
            return Err(RoleError {
                item: Some(i),
                ..err(
                    "spec.allow.logins",
                    format!("{:?}: allowed logins are names, not patterns", l.as_str()),
                )
            });
        }
        // The evaluator denies a login by exact name, or every login for `*`; a pattern such as
        // `ro*` (or a shell glob, `ro?t`, `r[o]ot`) would be stored and deny nothing, so it is
        // refused here rather than mislead.
        if let Some((i, l)) = self.spec.deny.logins.iter().enumerate().find(|(_, l)| {
            let l = l.as_str();
            !l.contains("{{") && l != "*" && l.contains(['*', '^', '?', '['])
        }) {
            return Err(RoleError {
                item: Some(i),
                ..err(
                    "spec.deny.logins",
                    format!(
                        "{:?}: denied logins are names, or `*` for every login, not patterns",
                        l.as_str()
                    ),
                )
            });
        }
        Ok(())
    }

    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// The role's revision: the SHA-256 of its JSON, hex. An editor that read one revision
    /// saves over that revision only (`PutRole::revision`), so a role changed meanwhile is not
    /// silently overwritten.
    pub fn revision(&self) -> String {
        let json = serde_json::to_string(self).unwrap_or_default();
        hex::encode(crate::sha256(json.as_bytes()))
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
        resources: resources.iter().filter_map(|s| Word::new(s).ok()).collect(),
        verbs: verbs.iter().filter_map(|s| Word::new(s).ok()).collect(),
    };
    vec![
        role(
            "access",
            "reach every node and cluster as the user's own logins and groups",
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

    /// A term every matching node must satisfy with one of a few exact values, if there is one:
    /// what [`LabelIndex`] files the selector under.
    fn exact_term(&self) -> Option<(&str, Vec<&str>)> {
        self.terms.iter().find_map(|(key, matchers)| {
            let key = key.as_deref()?;
            let values: Option<Vec<&str>> = matchers
                .iter()
                .map(|m| match m {
                    LabelMatcher::Exact(v) => Some(v.as_str()),
                    _ => None,
                })
                .collect();
            values.filter(|v| !v.is_empty()).map(|v| (key, v))
        })
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

/// Selectors filed by one of their exact `key=value` terms, so that finding the selectors a node
/// might match costs a few hash lookups instead of one match per role.
#[derive(Debug, Clone, Default)]
struct LabelIndex {
    by_exact: HashMap<String, HashMap<String, Vec<usize>>>,
    /// Selectors with no exact term (globs, regexes, wildcards everywhere).
    rest: Vec<usize>,
}

impl LabelIndex {
    fn insert(&mut self, i: usize, selector: &LabelSelector) {
        match selector.exact_term() {
            Some((key, values)) => {
                let by_value = self.by_exact.entry(key.to_string()).or_default();
                for v in values {
                    by_value.entry(v.to_string()).or_default().push(i);
                }
            }
            None => self.rest.push(i),
        }
    }

    /// Indices (ascending, so the first role in order decides) of selectors that may match.
    fn candidates(&self, labels: &BTreeMap<String, String>) -> Vec<usize> {
        let mut out: Vec<usize> = self.rest.clone();
        for (k, by_value) in &self.by_exact {
            if let Some(hits) = labels.get(k).and_then(|v| by_value.get(v)) {
                out.extend_from_slice(hits);
            }
        }
        out.sort_unstable();
        out.dedup();
        out
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

/// One side of a role with templates expanded for one identity and matchers compiled.
#[derive(Debug, Clone, Default)]
struct CompiledConditions {
    logins: BTreeSet<String>,
    node_labels: LabelSelector,
    kubernetes_groups: BTreeSet<String>,
    kubernetes_users: BTreeSet<String>,
    kubernetes_labels: LabelSelector,
    kubernetes_resources: Vec<CompiledKubeResource>,
    rules: Vec<Rule>,
    host_groups: Vec<HostGroup>,
    host_sudoers: Vec<SudoersLine>,
}

#[derive(Debug, Clone)]
struct CompiledKubeResource {
    kind: String,
    namespace: LabelMatcher,
    name: LabelMatcher,
    verbs: Vec<String>,
    source: String,
}

impl CompiledKubeResource {
    /// Teleport's v7 rules: `kind: namespace` covers the namespace object and everything in
    /// the namespaces its `name` matches; a cluster-wide kind ignores the rule's `namespace`;
    /// a kind outside the vocabulary (a custom resource) matches only `kind: '*'`.
    fn matches(&self, r: &KubeRequest<'_>) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || v == r.verb) {
            return false;
        }
        if self.kind == "namespace" {
            return if r.kind == "namespace" {
                self.name.matches(r.name)
            } else {
                !r.namespace.is_empty() && self.name.matches(r.namespace)
            };
        }
        (self.kind == "*" || self.kind == r.kind)
            && (crate::kube::cluster_wide(r.kind) || self.namespace.matches(r.namespace))
            && self.name.matches(r.name)
    }

    /// Could this rule match some object of a collection: `kind` in `namespace` (`""`: every
    /// namespace) for `verb`? Generous where unsure: an allow rule it says yes to only lets a
    /// list be forwarded, and every item is checked with [`Self::matches`] on the way back.
    fn may_match_some(&self, kind: &str, namespace: &str, verb: &str) -> bool {
        if !self.verbs.iter().any(|v| v == "*" || v == verb) {
            return false;
        }
        if self.kind == "namespace" {
            return kind == "namespace"
                || (!crate::kube::cluster_wide(kind)
                    && (namespace.is_empty() || self.name.matches(namespace)));
        }
        (self.kind == "*" || self.kind == kind)
            && (crate::kube::cluster_wide(kind)
                || namespace.is_empty()
                || self.namespace.matches(namespace))
    }

    /// Does this rule match every object of the collection? Sparing where unsure: a no only
    /// means the list is filtered item by item (an allow rule) or not refused whole (a deny
    /// rule).
    fn matches_all(&self, kind: &str, namespace: &str, verb: &str) -> bool {
        let any = |m: &LabelMatcher| matches!(m, LabelMatcher::Any);
        if !self.verbs.iter().any(|v| v == "*" || v == verb) {
            return false;
        }
        if self.kind == "namespace" {
            return if kind == "namespace" {
                any(&self.name)
            } else if crate::kube::cluster_wide(kind) {
                false
            } else if namespace.is_empty() {
                any(&self.name)
            } else {
                self.name.matches(namespace)
            };
        }
        (self.kind == "*" || self.kind == kind)
            && any(&self.name)
            && (crate::kube::cluster_wide(kind)
                || any(&self.namespace)
                || (!namespace.is_empty() && self.namespace.matches(namespace)))
    }
}

fn expand_all(values: &[Pattern], traits: &Traits) -> BTreeSet<String> {
    values
        .iter()
        .flat_map(|v| template::expand(v.as_str(), traits))
        .collect()
}

fn selector(labels: &BTreeMap<String, LabelValues>, traits: &Traits) -> LabelSelector {
    let expanded = labels
        .iter()
        .map(|(k, vs)| {
            (
                k.clone(),
                vs.values()
                    .iter()
                    .flat_map(|v| template::expand(v.as_str(), traits))
                    .collect(),
            )
        })
        .collect();
    LabelSelector::compile(&expanded)
}

impl CompiledConditions {
    fn compile(c: &Conditions, traits: &Traits, allow: bool) -> Self {
        let mut kubernetes_resources: Vec<CompiledKubeResource> = c
            .kubernetes_resources
            .iter()
            .filter_map(|r| {
                let ns = template::expand(r.namespace.as_str(), traits)
                    .into_iter()
                    .next()?;
                let name = template::expand(r.name.as_str(), traits)
                    .into_iter()
                    .next()?;
                Some(CompiledKubeResource {
                    kind: r.kind.as_str().to_string(),
                    namespace: LabelMatcher::compile(&ns).ok()?,
                    name: LabelMatcher::compile(&name).ok()?,
                    verbs: r.verbs.iter().map(|v| v.as_str().to_string()).collect(),
                    source: format!("{}/{}/{}", r.kind.as_str(), ns, name),
                })
            })
            .collect();
        // An allow side that grants clusters but names no resources grants every resource on
        // them (Kubernetes RBAC still decides); a deny side with none denies none.
        if allow && kubernetes_resources.is_empty() && !c.kubernetes_labels.is_empty() {
            kubernetes_resources.push(CompiledKubeResource {
                kind: "*".into(),
                namespace: LabelMatcher::Any,
                name: LabelMatcher::Any,
                verbs: vec!["*".into()],
                source: "*/*/*".into(),
            });
        }
        CompiledConditions {
            logins: expand_all(&c.logins, traits),
            node_labels: selector(&c.node_labels, traits),
            kubernetes_groups: expand_all(&c.kubernetes_groups, traits),
            kubernetes_users: expand_all(&c.kubernetes_users, traits),
            kubernetes_labels: selector(&c.kubernetes_labels, traits),
            kubernetes_resources,
            rules: c.rules.clone(),
            host_groups: c.host_groups.clone(),
            host_sudoers: c.host_sudoers.clone(),
        }
    }
}

#[derive(Debug, Clone)]
struct CompiledRole {
    name: String,
    options: RoleOptions,
    allow: CompiledConditions,
    deny: CompiledConditions,
}

/// How [`RoleSet::check_node`] decides, before its explanation is written.
enum NodeVerdict<'a> {
    /// A role denies the login (the role's index).
    LoginDenied(usize),
    /// A role denies nodes with these labels.
    LabelsDenied(&'a CompiledRole),
    /// No role allows the login anywhere.
    NoRole,
    Allowed(&'a CompiledRole),
    /// Roles allow the login (these), on nodes with other labels.
    OtherLabels(&'a [usize]),
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

/// A Kubernetes request as the evaluator sees it.
#[derive(Debug, Clone, Copy)]
pub struct KubeRequest<'a> {
    pub kind: &'a str,
    pub namespace: &'a str,
    pub name: &'a str,
    pub verb: &'a str,
}

/// All the roles one identity holds, compiled once and indexed so that a decision costs about
/// the same with ten roles or ten thousand.
#[derive(Debug, Clone)]
pub struct RoleSet {
    roles: Vec<CompiledRole>,
    /// Denied login → first role denying it.
    deny_logins: HashMap<String, usize>,
    /// The first role denying every login (`deny: logins: ['*']`).
    deny_all_logins: Option<usize>,
    /// Allowed login → roles allowing it, in order.
    allow_by_login: HashMap<String, Vec<usize>>,
    /// Deny-side node selectors, indexed.
    deny_nodes: LabelIndex,
    /// Allow-side node selectors, indexed.
    allow_nodes: LabelIndex,
}

impl RoleSet {
    pub fn new(roles: &[Role], traits: &Traits) -> Self {
        let roles: Vec<CompiledRole> = roles
            .iter()
            .map(|r| CompiledRole {
                name: r.metadata.name.clone(),
                options: r.spec.options.clone(),
                allow: CompiledConditions::compile(&r.spec.allow, traits, true),
                deny: CompiledConditions::compile(&r.spec.deny, traits, false),
            })
            .collect();
        let mut deny_logins = HashMap::new();
        let mut allow_by_login: HashMap<String, Vec<usize>> = HashMap::new();
        let (mut deny_nodes, mut allow_nodes) = (LabelIndex::default(), LabelIndex::default());
        for (i, r) in roles.iter().enumerate() {
            for l in &r.deny.logins {
                deny_logins.entry(l.clone()).or_insert(i);
            }
            for l in &r.allow.logins {
                allow_by_login.entry(l.clone()).or_default().push(i);
            }
            if !r.deny.node_labels.is_empty() {
                deny_nodes.insert(i, &r.deny.node_labels);
            }
            if !r.allow.node_labels.is_empty() {
                allow_nodes.insert(i, &r.allow.node_labels);
            }
        }
        let deny_all_logins = deny_logins.get("*").copied();
        RoleSet {
            roles,
            deny_logins,
            deny_all_logins,
            allow_by_login,
            deny_nodes,
            allow_nodes,
        }
    }

    pub fn names(&self) -> Vec<String> {
        self.roles.iter().map(|r| r.name.clone()).collect()
    }

    /// Logins any role allows and no role denies: the principals of a user certificate.
    pub fn logins(&self) -> Vec<String> {
        if self.deny_all_logins.is_some() {
            return Vec::new();
        }
        let mut out: Vec<String> = self
            .allow_by_login
            .keys()
            .filter(|l| !self.deny_logins.contains_key(*l))
            .cloned()
            .collect();
        out.sort();
        out
    }

    /// The shortest `max_session_ttl` of any role (default 12h).
    pub fn max_session_ttl(&self) -> Duration {
        self.roles
            .iter()
            .filter_map(|r| r.options.max_session_ttl.map(|d| d.0))
            .min()
            .unwrap_or(DEFAULT_SESSION_TTL)
    }

    /// The shortest `client_idle_timeout` of any role, if any sets one.
    pub fn client_idle_timeout(&self) -> Option<Duration> {
        self.roles
            .iter()
            .filter_map(|r| r.options.client_idle_timeout.map(|d| d.0))
            .min()
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

    /// Every role must allow file copy (the default is to allow).
    pub fn ssh_file_copy(&self) -> bool {
        self.roles
            .iter()
            .all(|r| r.options.ssh_file_copy != Some(false))
    }

    pub fn disconnect_expired_cert(&self) -> bool {
        self.roles
            .iter()
            .any(|r| r.options.disconnect_expired_cert == Some(true))
    }

    pub fn max_sessions(&self) -> Option<u32> {
        self.roles
            .iter()
            .filter_map(|r| r.options.max_sessions)
            .min()
    }

    /// Whether any role asks for the person's input in recordings (off by default).
    pub fn record_input(&self) -> bool {
        self.roles
            .iter()
            .any(|r| r.options.record_input == Some(true))
    }

    /// Whether and how an agent may create `login` on a node with these labels when the
    /// login does not exist there, as Teleport decides it: every role that allows this login on
    /// this node must ask for it (a role that does not say counts as `off`, so one `off` is
    /// enough to refuse); `keep` wins over `insecure-drop`; the groups and sudoers lines are the
    /// union of those roles' allow sides, less what any role's deny side names (`*` in deny
    /// `host_sudoers` removes every line). `None` when the login is not allowed there at all.
    pub fn host_user(&self, login: &str, labels: &BTreeMap<String, String>) -> Option<HostUser> {
        if !self.check_node(login, labels).allowed {
            return None;
        }
        let mut mode: Option<HostUserMode> = None;
        let mut groups: Vec<HostGroup> = Vec::new();
        let mut sudoers: Vec<SudoersLine> = Vec::new();
        for &i in self.allow_by_login.get(login)? {
            let r = &self.roles[i];
            if !r.allow.node_labels.matches(labels) {
                continue;
            }
            let m = r.options.create_host_user_mode.unwrap_or(HostUserMode::Off);
            mode = Some(match (mode, m) {
                (_, HostUserMode::Off) => return None,
                (Some(HostUserMode::Keep), _) | (_, HostUserMode::Keep) => HostUserMode::Keep,
                _ => HostUserMode::InsecureDrop,
            });
            for g in &r.allow.host_groups {
                if !groups.contains(g) {
                    groups.push(g.clone());
                }
            }
            for l in &r.allow.host_sudoers {
                if !sudoers.contains(l) {
                    sudoers.push(l.clone());
                }
            }
        }
        for r in &self.roles {
            groups.retain(|g| !r.deny.host_groups.contains(g));
            if r.deny.host_sudoers.iter().any(|l| l.as_str() == "*") {
                sudoers.clear();
            }
            sudoers.retain(|l| !r.deny.host_sudoers.contains(l));
        }
        Some(HostUser {
            mode: mode?,
            groups,
            sudoers,
        })
    }

    pub fn max_connections(&self) -> Option<u32> {
        self.roles
            .iter()
            .filter_map(|r| r.options.max_connections)
            .min()
    }

    /// The strictest SSH recording mode of any role (default best effort).
    pub fn record_ssh(&self) -> RecordMode {
        self.roles
            .iter()
            .filter_map(|r| {
                r.options
                    .record_session
                    .as_ref()
                    .and_then(|s| s.ssh.or(s.default))
            })
            .max()
            .unwrap_or(RecordMode::BestEffort)
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

    fn denied_node(&self, labels: &BTreeMap<String, String>) -> Option<&CompiledRole> {
        self.deny_nodes
            .candidates(labels)
            .into_iter()
            .map(|i| &self.roles[i])
            .find(|r| r.deny.node_labels.matches(labels))
    }

    /// May this identity log in as `login` on a node with these labels? Deny beats allow.
    pub fn check_node(&self, login: &str, labels: &BTreeMap<String, String>) -> Decision {
        match self.node_verdict(login, labels) {
            NodeVerdict::LoginDenied(i) => {
                Decision::deny(format!("role {} denies login {login}", self.roles[i].name))
            }
            NodeVerdict::LabelsDenied(r) => Decision::deny(format!(
                "role {} denies nodes with labels {}",
                r.name,
                r.deny.node_labels.describe()
            )),
            NodeVerdict::NoRole => Decision::deny(format!("no role allows login {login}")),
            NodeVerdict::Allowed(r) => Decision::allow(format!(
                "role {} allows login {login} on nodes with labels {}",
                r.name,
                r.allow.node_labels.describe()
            )),
            NodeVerdict::OtherLabels(candidates) => {
                let mut names: Vec<&str> = candidates
                    .iter()
                    .take(3)
                    .map(|&i| self.roles[i].name.as_str())
                    .collect();
                if candidates.len() > 3 {
                    names.push("...");
                }
                Decision::deny(format!(
                    "login {login} is allowed by role {} only on nodes with other labels",
                    names.join(", ")
                ))
            }
        }
    }

    /// [`check_node`](Self::check_node)'s answer without its explanation: what a listing of
    /// many nodes asks for each (`sally ls`'s logins), where writing the sentence was most of
    /// the cost.
    pub fn allows_node(&self, login: &str, labels: &BTreeMap<String, String>) -> bool {
        matches!(self.node_verdict(login, labels), NodeVerdict::Allowed(_))
    }

    /// The one decision behind [`check_node`](Self::check_node) and
    /// [`allows_node`](Self::allows_node).
    fn node_verdict(&self, login: &str, labels: &BTreeMap<String, String>) -> NodeVerdict<'_> {
        if let Some(&i) = self
            .deny_logins
            .get(login)
            .or(self.deny_all_logins.as_ref())
        {
            return NodeVerdict::LoginDenied(i);
        }
        if let Some(r) = self.denied_node(labels) {
            return NodeVerdict::LabelsDenied(r);
        }
        let Some(candidates) = self.allow_by_login.get(login) else {
            return NodeVerdict::NoRole;
        };
        for i in self.allow_nodes.candidates(labels) {
            let r = &self.roles[i];
            if r.allow.logins.contains(login) && r.allow.node_labels.matches(labels) {
                return NodeVerdict::Allowed(r);
            }
        }
        NodeVerdict::OtherLabels(candidates)
    }

    /// Is a node with these labels listed to this identity (`sally ls`)?
    pub fn can_see_node(&self, labels: &BTreeMap<String, String>) -> bool {
        self.denied_node(labels).is_none()
            && self
                .allow_nodes
                .candidates(labels)
                .into_iter()
                .any(|i| self.roles[i].allow.node_labels.matches(labels))
    }

    /// May this identity make `req` on a cluster with these labels? Deny beats allow.
    pub fn check_kube(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        req: &KubeRequest<'_>,
    ) -> Decision {
        for r in &self.roles {
            if !r.deny.kubernetes_labels.is_empty()
                && r.deny.kubernetes_labels.matches(cluster_labels)
            {
                return Decision::deny(format!(
                    "role {} denies clusters with labels {}",
                    r.name,
                    r.deny.kubernetes_labels.describe()
                ));
            }
            if let Some(k) = r.deny.kubernetes_resources.iter().find(|k| k.matches(req)) {
                return Decision::deny(format!(
                    "role {} denies `{}` on {}",
                    r.name, req.verb, k.source
                ));
            }
        }
        let mut cluster_ok = false;
        for r in &self.roles {
            if r.allow.kubernetes_labels.matches(cluster_labels) {
                cluster_ok = true;
                if let Some(k) = r.allow.kubernetes_resources.iter().find(|k| k.matches(req)) {
                    return Decision::allow(format!(
                        "role {} allows `{}` on {}",
                        r.name, req.verb, k.source
                    ));
                }
            }
        }
        let what = format!("{}/{}/{}", req.kind, req.namespace, req.name);
        if cluster_ok {
            Decision::deny(format!("no role allows `{}` on {what}", req.verb))
        } else {
            Decision::deny("no role allows a cluster with these labels".into())
        }
    }

    /// Is a cluster with these labels listed to this identity (`sally kube ls`), and may it
    /// get a certificate for it?
    pub fn can_see_kube(&self, cluster_labels: &BTreeMap<String, String>) -> bool {
        !self.roles.iter().any(|r| {
            !r.deny.kubernetes_labels.is_empty() && r.deny.kubernetes_labels.matches(cluster_labels)
        }) && self
            .roles
            .iter()
            .any(|r| r.allow.kubernetes_labels.matches(cluster_labels))
    }

    /// Could any object of `kind` in `namespace` (`""`: every namespace) be allowed for `verb`
    /// (`list` or `watch`) on a cluster with these labels? Yes when a role that matches the
    /// cluster has an allow rule that could match one of them (`kind: namespace` rules cover
    /// what is in the namespaces their name matches; cluster-wide kinds ignore namespaces), and
    /// no deny rule covers the whole collection. The door then forwards the list and keeps only
    /// the items [`Self::check_kube`] allows.
    pub fn kube_may_list(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        kind: &str,
        namespace: &str,
        verb: &str,
    ) -> bool {
        !self.kube_denies_all(cluster_labels, kind, namespace, verb)
            && self
                .kube_listing_roles(cluster_labels, kind, namespace, verb)
                .next()
                .is_some()
    }

    /// Does every object of the collection stand allowed, so that the list may be forwarded as
    /// it is? Only when an allow rule of a role matching the cluster covers all of it (any name,
    /// its namespace or every one) and no deny rule could match a single item.
    pub fn kube_allows_whole_list(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        kind: &str,
        namespace: &str,
        verb: &str,
    ) -> bool {
        let deny_some = self.roles.iter().any(|r| {
            (!r.deny.kubernetes_labels.is_empty()
                && r.deny.kubernetes_labels.matches(cluster_labels))
                || r.deny
                    .kubernetes_resources
                    .iter()
                    .any(|k| k.may_match_some(kind, namespace, verb))
        });
        !deny_some
            && self.roles.iter().any(|r| {
                r.allow.kubernetes_labels.matches(cluster_labels)
                    && r.allow
                        .kubernetes_resources
                        .iter()
                        .any(|k| k.matches_all(kind, namespace, verb))
            })
    }

    /// The groups and users to impersonate for a list or watch that [`Self::kube_may_list`]
    /// allows: those of the roles that could allow an item of it, less the ones any role denies.
    pub fn kube_principals_for_list(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        kind: &str,
        namespace: &str,
        verb: &str,
    ) -> (Vec<String>, Vec<String>) {
        let mut groups = BTreeSet::new();
        let mut users = BTreeSet::new();
        for r in self.kube_listing_roles(cluster_labels, kind, namespace, verb) {
            groups.extend(r.allow.kubernetes_groups.iter().cloned());
            users.extend(r.allow.kubernetes_users.iter().cloned());
        }
        self.less_denied_principals(groups, users)
    }

    /// Roles matching the cluster with an allow rule that could match an object of the
    /// collection.
    fn kube_listing_roles<'a>(
        &'a self,
        cluster_labels: &'a BTreeMap<String, String>,
        kind: &'a str,
        namespace: &'a str,
        verb: &'a str,
    ) -> impl Iterator<Item = &'a CompiledRole> {
        self.roles.iter().filter(move |r| {
            r.allow.kubernetes_labels.matches(cluster_labels)
                && r.allow
                    .kubernetes_resources
                    .iter()
                    .any(|k| k.may_match_some(kind, namespace, verb))
        })
    }

    /// Does a role deny the cluster, or every object of the collection?
    fn kube_denies_all(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        kind: &str,
        namespace: &str,
        verb: &str,
    ) -> bool {
        self.roles.iter().any(|r| {
            (!r.deny.kubernetes_labels.is_empty()
                && r.deny.kubernetes_labels.matches(cluster_labels))
                || r.deny
                    .kubernetes_resources
                    .iter()
                    .any(|k| k.matches_all(kind, namespace, verb))
        })
    }

    /// The groups and users to impersonate on a cluster with these labels.
    pub fn kube_principals(
        &self,
        cluster_labels: &BTreeMap<String, String>,
    ) -> (Vec<String>, Vec<String>) {
        self.kube_principals_for(cluster_labels, None)
    }

    /// The groups and users to impersonate for one request: those of the roles that match the
    /// cluster *and* allow the request (every role matching the cluster when `req` is none, as
    /// for discovery), less the ones any role denies.
    pub fn kube_principals_for(
        &self,
        cluster_labels: &BTreeMap<String, String>,
        req: Option<&KubeRequest<'_>>,
    ) -> (Vec<String>, Vec<String>) {
        let mut groups = BTreeSet::new();
        let mut users = BTreeSet::new();
        for r in &self.roles {
            if r.allow.kubernetes_labels.matches(cluster_labels)
                && req.is_none_or(|q| r.allow.kubernetes_resources.iter().any(|k| k.matches(q)))
            {
                groups.extend(r.allow.kubernetes_groups.iter().cloned());
                users.extend(r.allow.kubernetes_users.iter().cloned());
            }
        }
        self.less_denied_principals(groups, users)
    }

    fn less_denied_principals(
        &self,
        mut groups: BTreeSet<String>,
        mut users: BTreeSet<String>,
    ) -> (Vec<String>, Vec<String>) {
        for r in &self.roles {
            for g in &r.deny.kubernetes_groups {
                groups.remove(g);
            }
            for u in &r.deny.kubernetes_users {
                users.remove(u);
            }
        }
        (groups.into_iter().collect(), users.into_iter().collect())
    }
}

#[cfg(test)]
mod tests;
