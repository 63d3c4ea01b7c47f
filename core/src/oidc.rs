//! OpenID Connect connectors (`kind: oidc`) and what follows from a provider's claims: the
//! user's name, traits and roles. Pure: no I/O; auth does the protocol.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::role::Metadata;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConnector {
    pub kind: String,
    pub version: String,
    pub metadata: Metadata,
    pub spec: OidcSpec,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcSpec {
    pub issuer_url: String,
    pub client_id: String,
    /// Never printed back: [`OidcConnector::redacted`] replaces it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_secret_file: Option<String>,
    pub redirect_url: String,
    #[serde(default = "default_scopes")]
    pub scopes: Vec<String>,
    #[serde(default = "default_username_claim")]
    pub username_claim: String,
    #[serde(default)]
    pub claims_to_roles: Vec<ClaimMapping>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ClaimMapping {
    pub claim: String,
    /// A literal, or `^regex$` whose groups fill `$1`… in `roles`.
    pub value: String,
    pub roles: Vec<String>,
}

fn default_scopes() -> Vec<String> {
    vec!["openid".into(), "email".into(), "profile".into()]
}

fn default_username_claim() -> String {
    "email".into()
}

pub const REDACTED: &str = "********";

fn is_loopback_http(url: &str) -> bool {
    url.starts_with("http://127.0.0.1:")
        || url.starts_with("http://127.0.0.1/")
        || url.starts_with("http://localhost:")
        || url.starts_with("http://localhost/")
        || url.starts_with("http://[::1]")
}

impl OidcConnector {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// What the types cannot check: kind, version, name, URLs, patterns.
    pub fn validate(&self) -> Result<(), String> {
        if self.kind != "oidc" {
            return Err(format!("kind {:?} is not oidc", self.kind));
        }
        if self.version != "v1" {
            return Err(format!("version {:?}: use v1", self.version));
        }
        crate::names::validate("connector", &self.metadata.name).map_err(|e| e.to_string())?;
        let s = &self.spec;
        // Plain HTTP only on loopback (a provider on the same host, as in tests).
        for (field, url) in [
            ("issuer_url", &s.issuer_url),
            ("redirect_url", &s.redirect_url),
        ] {
            if !(url.starts_with("https://") || is_loopback_http(url)) {
                return Err(format!(
                    "spec.{field}: {url:?} must be an https:// URL (http:// only on loopback)"
                ));
            }
        }
        if !s.redirect_url.ends_with("/v1/webapi/oidc/callback") {
            return Err(format!(
                "spec.redirect_url: {:?} must be the proxy's https://HOST:PORT/v1/webapi/oidc/callback",
                s.redirect_url
            ));
        }
        if s.client_id.is_empty() {
            return Err("spec.client_id is empty".into());
        }
        match (&s.client_secret, &s.client_secret_file) {
            (Some(_), Some(_)) => {
                return Err("give spec.client_secret or spec.client_secret_file, not both".into());
            }
            (None, None) => {
                return Err("spec.client_secret or spec.client_secret_file is required".into());
            }
            _ => {}
        }
        if !s.scopes.iter().any(|x| x == "openid") {
            return Err("spec.scopes must include openid".into());
        }
        for (i, m) in s.claims_to_roles.iter().enumerate() {
            if m.value.starts_with('^') {
                regex::Regex::new(&m.value).map_err(|e| {
                    format!("spec.claims_to_roles[{i}].value: not a regular expression: {e}")
                })?;
            }
            if m.roles.is_empty() {
                return Err(format!("spec.claims_to_roles[{i}].roles is empty"));
            }
        }
        Ok(())
    }

    /// The connector as it may be shown: the secret replaced.
    pub fn redacted(&self) -> Self {
        let mut c = self.clone();
        if c.spec.client_secret.is_some() {
            c.spec.client_secret = Some(REDACTED.into());
        }
        c
    }
}

/// A claim's values: a string is one value, an array of strings several.
fn claim_values(claims: &BTreeMap<String, Value>, name: &str) -> Vec<String> {
    match claims.get(name) {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Array(a)) => a
            .iter()
            .filter_map(|v| v.as_str().map(str::to_string))
            .collect(),
        Some(Value::Bool(b)) => vec![b.to_string()],
        Some(Value::Number(n)) => vec![n.to_string()],
        _ => vec![],
    }
}

/// The roles `claims` map to, and which (claim, value) pairs did the mapping.
pub fn map_roles(
    rules: &[ClaimMapping],
    claims: &BTreeMap<String, Value>,
) -> (Vec<String>, Vec<(String, String)>) {
    let mut roles: Vec<String> = Vec::new();
    let mut matched = Vec::new();
    for rule in rules {
        for value in claim_values(claims, &rule.claim) {
            let produced: Vec<String> = if rule.value.starts_with('^') {
                let Ok(re) = regex::Regex::new(&rule.value) else {
                    continue;
                };
                let Some(caps) = re.captures(&value) else {
                    continue;
                };
                rule.roles
                    .iter()
                    .map(|r| {
                        let mut out = String::new();
                        caps.expand(r, &mut out);
                        out
                    })
                    .collect()
            } else if rule.value == value || rule.value == "*" {
                rule.roles.clone()
            } else {
                continue;
            };
            let produced: Vec<String> = produced
                .into_iter()
                .filter(|r| crate::names::validate("role", r).is_ok())
                .collect();
            if produced.is_empty() {
                continue;
            }
            matched.push((rule.claim.clone(), value.clone()));
            for r in produced {
                if !roles.contains(&r) {
                    roles.push(r);
                }
            }
        }
    }
    (roles, matched)
}

/// The user's traits from the claims: every string or list-of-strings claim, as
/// `external.NAME` (`{{external.NAME}}` in roles).
pub fn traits(claims: &BTreeMap<String, Value>) -> BTreeMap<String, Vec<String>> {
    const SKIP: &[&str] = &[
        "iss",
        "aud",
        "exp",
        "iat",
        "nbf",
        "nonce",
        "azp",
        "at_hash",
        "c_hash",
        "auth_time",
        "sid",
        "jti",
    ];
    claims
        .keys()
        .filter(|k| !SKIP.contains(&k.as_str()))
        .map(|k| (format!("external.{k}"), claim_values(claims, k)))
        .filter(|(_, v)| !v.is_empty())
        .collect()
}

/// The Sallyport user name from the claims: the `username_claim`'s value, which must be a
/// valid user name.
pub fn username(spec: &OidcSpec, claims: &BTreeMap<String, Value>) -> Result<String, String> {
    let v = claim_values(claims, &spec.username_claim);
    let name = v.first().ok_or_else(|| {
        format!(
            "the provider's ID token has no {:?} claim to name the user (username_claim)",
            spec.username_claim
        )
    })?;
    crate::names::validate("user", name)
        .map_err(|e| format!("claim {:?} = {name:?}: {e}", spec.username_claim))?;
    Ok(name.clone())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn claims(v: Value) -> BTreeMap<String, Value> {
        serde_json::from_value(v).unwrap()
    }

    #[test]
    fn claims_map_to_roles_with_literals_and_regex_groups() {
        let rules = vec![
            ClaimMapping {
                claim: "groups".into(),
                value: "admins".into(),
                roles: vec!["editor".into(), "access".into()],
            },
            ClaimMapping {
                claim: "groups".into(),
                value: "^team-(.*)$".into(),
                roles: vec!["$1-access".into()],
            },
        ];
        let (roles, matched) = map_roles(
            &rules,
            &claims(serde_json::json!({"groups": ["admins", "team-db", "other"]})),
        );
        assert_eq!(roles, vec!["editor", "access", "db-access"]);
        assert_eq!(matched.len(), 2);
        let (none, _) = map_roles(&rules, &claims(serde_json::json!({"groups": "nobody"})));
        assert!(none.is_empty());
        // A group that would make an invalid role name maps to nothing.
        let (bad, _) = map_roles(&rules, &claims(serde_json::json!({"groups": ["team-a b"]})));
        assert!(bad.is_empty(), "{bad:?}");
    }

    #[test]
    fn connectors_are_checked_and_secrets_redacted() {
        let yaml = "kind: oidc\nversion: v1\nmetadata: {name: corp}\nspec:\n  issuer_url: https://idp.example.com\n  client_id: sallyport\n  client_secret: hunter2\n  redirect_url: https://proxy.example.com:3080/v1/webapi/oidc/callback\n  claims_to_roles:\n    - {claim: groups, value: '^team-(.*)$', roles: ['$1-access']}\n";
        let c: OidcConnector = serde_saphyr::from_str(yaml).unwrap();
        c.validate().unwrap();
        assert_eq!(c.spec.username_claim, "email");
        let shown = serde_json::to_string(&c.redacted()).unwrap();
        assert!(!shown.contains("hunter2"));
        let mut bad = c.clone();
        bad.spec.issuer_url = "http://idp.example.com".into();
        assert!(bad.validate().unwrap_err().contains("https"));
        let mut bad = c.clone();
        bad.spec.claims_to_roles[0].value = "^team-(".into();
        assert!(bad.validate().is_err());
        let mut bad = c;
        bad.spec.client_secret = None;
        assert!(bad.validate().is_err());
    }
}
