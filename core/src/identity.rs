//! Who a request speaks for: the user, the roles they hold and the traits that fill role
//! templates. An identity is what a certificate carries and what every door authorizes.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// Traits keyed by their template name: `internal.logins`, `external.groups`, ...
pub type Traits = BTreeMap<String, Vec<String>>;

/// The identity a certificate was issued for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Identity {
    pub user: String,
    pub roles: Vec<String>,
    #[serde(default)]
    pub traits: Traits,
}

/// The kind of account a user record is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum UserType {
    Local,
    Sso,
}

impl UserType {
    pub fn as_str(self) -> &'static str {
        match self {
            UserType::Local => "local",
            UserType::Sso => "sso",
        }
    }
}

/// Builds the internal traits of a local user from its record.
pub fn internal_traits(logins: &[String], kube_groups: &[String], kube_users: &[String]) -> Traits {
    let mut t = Traits::new();
    t.insert("internal.logins".into(), logins.to_vec());
    t.insert("internal.kubernetes_groups".into(), kube_groups.to_vec());
    t.insert("internal.kubernetes_users".into(), kube_users.to_vec());
    t
}
