//! OpenID Connect connectors (`kind: oidc`) and what follows from a provider's claims: the
//! user's name, traits and roles. Pure: no I/O; auth does the protocol.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::role::Metadata;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OidcConnector {
    pub kind: crate::api::ConnectorKind,
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

/// Where the proxy serves the provider's callback; a connector's `redirect_url` names exactly
/// this path on one of the proxy's addresses.
pub const CALLBACK_PATH: &str = "/v1/webapi/oidc/callback";

/// A connector URL, parsed: https, or plain http only to a loopback host (a provider on the
/// same machine, as in tests); no user info, query or fragment. Parsed rather than matched as
/// text: `http://127.0.0.1:1@evil.example/` starts like a loopback URL and is not one.
fn connector_url(field: &str, text: &str) -> Result<url::Url, String> {
    let u =
        url::Url::parse(text).map_err(|e| format!("spec.{field}: {text:?} is not a URL: {e}"))?;
    let loopback = match u.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        None => false,
    };
    let secure = u.scheme() == "https" && u.host().is_some();
    if !(secure || (u.scheme() == "http" && loopback)) {
        return Err(format!(
            "spec.{field}: {text:?} must be an https:// URL (http:// only on loopback)"
        ));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(format!(
            "spec.{field}: {text:?} must not carry a user name or password"
        ));
    }
    if u.query().is_some() || u.fragment().is_some() {
        return Err(format!(
            "spec.{field}: {text:?} must not have a query (?…) or fragment (#…)"
        ));
    }
    Ok(u)
}

/// Checks a connector's `redirect_url`: a [`connector_url`] whose path is exactly
/// [`CALLBACK_PATH`] after parsing (so `..` segments, a query or a fragment that merely end in
/// the path do not pass). Returns the parsed URL.
pub fn callback_url(text: &str) -> Result<url::Url, String> {
    let u = connector_url("redirect_url", text)?;
    if u.path() != CALLBACK_PATH {
        return Err(format!(
            "spec.redirect_url: {text:?} must be the proxy's https://HOST:PORT{CALLBACK_PATH}"
        ));
    }
    Ok(u)
}

impl OidcConnector {
    pub fn name(&self) -> &str {
        &self.metadata.name
    }

    /// What the types cannot check: version, name, URLs, patterns.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != "v1" {
            return Err(format!("version {:?}: use v1", self.version));
        }
        crate::names::validate("connector", &self.metadata.name).map_err(|e| e.to_string())?;
        let s = &self.spec;
        connector_url("issuer_url", &s.issuer_url)?;
        callback_url(&s.redirect_url)?;
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
/// valid user name. An `email` names the user only when the provider vouches for it: an
/// `email_verified` of false refuses the login (many providers let anyone type any address,
/// and the name is what roles, locks and recordings are kept under). A provider that sends no
/// `email_verified` at all is taken at its word, as most enterprise providers send none.
pub fn username(spec: &OidcSpec, claims: &BTreeMap<String, Value>) -> Result<String, String> {
    let v = claim_values(claims, &spec.username_claim);
    let name = v.first().ok_or_else(|| {
        format!(
            "the provider's ID token and UserInfo have no {:?} claim to name the user (username_claim)",
            spec.username_claim
        )
    })?;
    if spec.username_claim == "email" {
        // Some providers (Cognito) send the flag as a string.
        let vouched = match claims.get("email_verified") {
            None | Some(Value::Bool(true)) => true,
            Some(Value::String(s)) => s == "true",
            Some(_) => false,
        };
        if !vouched {
            return Err(format!(
                "your identity provider has not verified the email address {name:?} (email_verified is not true); verify it at the provider and log in again"
            ));
        }
    }
    crate::names::validate("user", name)
        .map_err(|e| format!("claim {:?} = {name:?}: {e}", spec.username_claim))?;
    Ok(name.clone())
}

/// Checks the ID token's authorized party (OpenID Connect Core 3.1.3.7, steps 4 and 5): with
/// several audiences `azp` must be present, and when present it must be our client.
pub fn check_authorized_party(
    claims: &BTreeMap<String, Value>,
    client_id: &str,
) -> Result<(), String> {
    let several = matches!(claims.get("aud"), Some(Value::Array(a)) if a.len() > 1);
    match claims.get("azp") {
        None if several => {
            Err("the ID token names several audiences but no authorized party (azp)".into())
        }
        None => Ok(()),
        Some(Value::String(azp)) if azp == client_id => Ok(()),
        Some(other) => Err(format!(
            "the ID token was issued to another client (azp {other})"
        )),
    }
}

/// Adds the UserInfo response's claims to the ID token's (OpenID Connect Core 5.4: with the
/// code flow a provider may answer `email` and `groups` only there). The response must be
/// about the same subject (5.3.2), or it is refused; a claim the signed ID token carries keeps
/// the ID token's value.
pub fn merge_userinfo(
    claims: &mut BTreeMap<String, Value>,
    userinfo: BTreeMap<String, Value>,
) -> Result<(), String> {
    let sub = claims.get("sub").and_then(Value::as_str);
    let info_sub = userinfo.get("sub").and_then(Value::as_str);
    if sub.is_none() || sub != info_sub {
        return Err(format!(
            "the provider's UserInfo is about another subject ({}) than the ID token ({})",
            info_sub.unwrap_or("none"),
            sub.unwrap_or("none")
        ));
    }
    for (k, v) in userinfo {
        claims.entry(k).or_insert(v);
    }
    Ok(())
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
        // The kind is the type's: another protocol does not parse as this connector.
        let saml = yaml.replace("kind: oidc", "kind: saml");
        let e = serde_saphyr::from_str::<OidcConnector>(&saml)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            e.contains("line 1 column 7: unknown variant `saml`, expected one of oidc"),
            "{e}"
        );
    }

    #[test]
    fn redirect_urls_are_matched_by_parsed_origin_and_path() {
        // (redirect_url, accepted): each refused row passed the old prefix/suffix test.
        let table = [
            (
                "https://proxy.example.com:3080/v1/webapi/oidc/callback",
                true,
            ),
            ("https://proxy.example.com/v1/webapi/oidc/callback", true),
            ("https://PROXY.example.com/v1/webapi/oidc/callback", true),
            ("http://127.0.0.1:3080/v1/webapi/oidc/callback", true),
            ("http://localhost:3080/v1/webapi/oidc/callback", true),
            ("http://[::1]:3080/v1/webapi/oidc/callback", true),
            ("http://127.0.0.2/v1/webapi/oidc/callback", true),
            // User info that makes a loopback-looking prefix name another host.
            (
                "http://127.0.0.1:3080@evil.example/v1/webapi/oidc/callback",
                false,
            ),
            (
                "http://localhost:@evil.example/v1/webapi/oidc/callback",
                false,
            ),
            (
                "https://admin:pw@proxy.example.com/v1/webapi/oidc/callback",
                false,
            ),
            // Plain http off loopback, and hosts that only start like loopback.
            ("http://proxy.example.com/v1/webapi/oidc/callback", false),
            (
                "http://localhost.evil.example/v1/webapi/oidc/callback",
                false,
            ),
            (
                "http://127.0.0.1.evil.example/v1/webapi/oidc/callback",
                false,
            ),
            // The path only at the end of a query or fragment, or under another prefix.
            ("https://evil.example/?next=/v1/webapi/oidc/callback", false),
            ("https://evil.example/x#/v1/webapi/oidc/callback", false),
            (
                "https://proxy.example.com/v1/webapi/oidc/callback?x=1",
                false,
            ),
            (
                "https://proxy.example.com/app/v1/webapi/oidc/callback",
                false,
            ),
            ("https://proxy.example.com/v1/webapi/oidc/callback/", false),
            (
                "https://proxy.example.com/v1/webapi/oidc/callback/../../x",
                false,
            ),
            ("https://proxy.example.com/v1/webapi/oidc/%63allback", false),
            ("javascript:alert(1)//v1/webapi/oidc/callback", false),
            ("https:///v1/webapi/oidc/callback", false),
            ("not a url /v1/webapi/oidc/callback", false),
        ];
        for (url, ok) in table {
            let got = callback_url(url);
            assert_eq!(got.is_ok(), ok, "{url}: {got:?}");
        }
        // The same rules for the issuer, whose path is free.
        for (url, ok) in [
            ("https://idp.example.com/realms/corp", true),
            ("http://127.0.0.1:8080", true),
            ("http://127.0.0.1:1@evil.example", false),
            ("http://idp.example.com", false),
            ("https://idp.example.com/?x=1", false),
        ] {
            assert_eq!(connector_url("issuer_url", url).is_ok(), ok, "{url}");
        }
    }

    #[test]
    fn an_email_names_the_user_only_when_the_provider_vouches_for_it() {
        let spec = |claim: &str| OidcSpec {
            issuer_url: "https://idp.example.com".into(),
            client_id: "sallyport".into(),
            client_secret: Some("s".into()),
            client_secret_file: None,
            redirect_url: format!("https://proxy.example.com{CALLBACK_PATH}"),
            scopes: default_scopes(),
            username_claim: claim.into(),
            claims_to_roles: vec![],
        };
        let email = spec("email");
        let table = [
            (
                serde_json::json!({"email": "a@x.io", "email_verified": true}),
                Ok("a@x.io"),
            ),
            (
                serde_json::json!({"email": "a@x.io", "email_verified": "true"}),
                Ok("a@x.io"),
            ),
            (serde_json::json!({"email": "a@x.io"}), Ok("a@x.io")),
            (
                serde_json::json!({"email": "a@x.io", "email_verified": false}),
                Err("not verified"),
            ),
            (
                serde_json::json!({"email": "a@x.io", "email_verified": "false"}),
                Err("not verified"),
            ),
            (
                serde_json::json!({"email": "a@x.io", "email_verified": 0}),
                Err("not verified"),
            ),
            (serde_json::json!({"sub": "a"}), Err("no \"email\" claim")),
        ];
        for (c, want) in table {
            let got = username(&email, &claims(c.clone()));
            match want {
                Ok(name) => assert_eq!(got.as_deref(), Ok(name), "{c}"),
                Err(needle) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(needle)),
                    "{c}: {got:?}"
                ),
            }
        }
        // Another username claim is not an email: email_verified does not apply to it.
        let by_name = spec("preferred_username");
        let c = claims(serde_json::json!({"preferred_username": "alice", "email_verified": false}));
        assert_eq!(username(&by_name, &c).as_deref(), Ok("alice"));
    }

    #[test]
    fn the_authorized_party_is_checked_when_present_and_required_with_several_audiences() {
        let table = [
            (serde_json::json!({"aud": "sallyport"}), true),
            (serde_json::json!({"aud": ["sallyport"]}), true),
            (
                serde_json::json!({"aud": "sallyport", "azp": "sallyport"}),
                true,
            ),
            (
                serde_json::json!({"aud": ["sallyport", "api"], "azp": "sallyport"}),
                true,
            ),
            (
                serde_json::json!({"aud": "sallyport", "azp": "someone-else"}),
                false,
            ),
            (serde_json::json!({"aud": ["sallyport", "api"]}), false),
            (
                serde_json::json!({"aud": ["sallyport", "api"], "azp": "api"}),
                false,
            ),
            (
                serde_json::json!({"aud": "sallyport", "azp": ["sallyport"]}),
                false,
            ),
        ];
        for (c, ok) in table {
            let got = check_authorized_party(&claims(c.clone()), "sallyport");
            assert_eq!(got.is_ok(), ok, "{c}: {got:?}");
        }
    }

    #[test]
    fn userinfo_claims_fill_in_for_the_same_subject_only() {
        let mut id =
            claims(serde_json::json!({"sub": "u1", "iss": "https://idp", "email": "signed@x.io"}));
        merge_userinfo(
            &mut id,
            claims(serde_json::json!({"sub": "u1", "email": "other@x.io", "groups": ["admins"], "iss": "https://evil"})),
        )
        .unwrap();
        assert_eq!(id["groups"], serde_json::json!(["admins"]));
        // The signed ID token's values stand.
        assert_eq!(id["email"], "signed@x.io");
        assert_eq!(id["iss"], "https://idp");
        for other in [
            serde_json::json!({"sub": "u2", "email": "a@x.io"}),
            serde_json::json!({"email": "a@x.io"}),
            serde_json::json!({"sub": 1}),
        ] {
            let mut id = claims(serde_json::json!({"sub": "u1"}));
            let e = merge_userinfo(&mut id, claims(other.clone())).unwrap_err();
            assert!(e.contains("another subject"), "{other}: {e}");
            assert!(!id.contains_key("email"), "nothing merged from {other}");
        }
    }
}
