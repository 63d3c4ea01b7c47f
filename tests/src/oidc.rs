//! A real OpenID provider for the SSO tests (tests/oidc/provider.mjs: the npm package
//! `oidc-provider`, installed by `npm ci` in tests/oidc), a connector to it and the roles its
//! claims map to. Used by `sso` (a scripted browser) and `web` (Chromium).
//!
//! The provider's accounts: alice (groups admins, team-db: roles sso-ops and db-readers),
//! bob (group nobody: no role), carol (address not verified), mallory (alice's address).

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use crate::{Cluster, free_port, run};

pub struct Provider {
    child: Child,
    /// The real provider's issuer, `http://HOST:PORT`.
    pub issuer: String,
    /// The hostile issuer (`POST /scenario/NAME` picks its defect).
    pub hostile: String,
}

impl Drop for Provider {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub fn oidc_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("oidc")
}

impl Provider {
    /// Replaces an account's claims at the provider (`login` stays its `sub`).
    pub fn set_user(&self, login: &str, claims: &str) {
        run(
            Command::new("curl").args([
                "-sf",
                "-X",
                "POST",
                "--data-binary",
                claims,
                &format!("{}/test/users/{login}", self.issuer),
            ]),
            "",
        )
        .ok();
    }
}

/// The provider with the library's defaults.
pub fn provider(c: &Cluster) -> Provider {
    provider_with(c, &[])
}

/// The provider with more environment: `CLAIMS_IN_ID_TOKEN=1` (claims in the ID token, no
/// UserInfo), `ISSUER_HOST=localhost` (another site than the proxy's 127.0.0.1, as a real
/// provider is: what a browser's SameSite rules see).
pub fn provider_with(c: &Cluster, env: &[(&str, &str)]) -> Provider {
    let (port, hport) = (free_port(), free_port());
    assert!(
        oidc_dir().join("node_modules/oidc-provider").exists(),
        "run scripts/test, which installs tests/oidc (npm ci)"
    );
    let mut child = Command::new("node")
        .arg(oidc_dir().join("provider.mjs"))
        .env("PORT", port.to_string())
        .env("HOSTILE_PORT", hport.to_string())
        .env("CLIENT_ID", "sallyport")
        .env("CLIENT_SECRET", "test-client-secret-0123456789")
        .env(
            "REDIRECT_URI",
            format!("https://{}/v1/webapi/oidc/callback", c.proxy),
        )
        // carol's provider has not verified her address; mallory's account claims alice's.
        .env(
            "USERS",
            r#"{"alice": {"email": "alice@example.com", "groups": ["admins", "team-db"]},
                "bob": {"email": "bob@example.com", "groups": ["nobody"]},
                "carol": {"email": "carol@example.com", "email_verified": false, "groups": ["admins"]},
                "mallory": {"email": "alice@example.com", "groups": ["admins"]}}"#,
        )
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("node");
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut issuer = String::new();
    let mut hostile = String::new();
    while issuer.is_empty() || hostile.is_empty() {
        let line = lines.next().expect("provider output").unwrap();
        if let Some(i) = line.strip_prefix("ready ") {
            issuer = i.to_string();
        }
        if let Some(i) = line.strip_prefix("hostile ") {
            hostile = i.to_string();
        }
    }
    // Keep reading: the provider logs notices to stdout, and a closed pipe would kill it.
    std::thread::spawn(move || for _ in lines.by_ref() {});
    Provider {
        child,
        issuer,
        hostile,
    }
}

/// Connector `name` to `issuer`: groups admins → sso-ops, team-X → X-readers.
pub fn connector(c: &Cluster, name: &str, issuer: &str) {
    let f = c.dir.path().join(format!("{name}.yaml"));
    std::fs::write(
        &f,
        format!(
            "kind: oidc\nversion: v1\nmetadata: {{name: {name}}}\nspec:\n  issuer_url: {issuer}\n  client_id: sallyport\n  client_secret: test-client-secret-0123456789\n  redirect_url: https://{proxy}/v1/webapi/oidc/callback\n  scopes: [openid, email, profile, groups]\n  claims_to_roles:\n    - {{claim: groups, value: admins, roles: [sso-ops]}}\n    - {{claim: groups, value: '^team-(.*)$', roles: ['$1-readers']}}\n",
            proxy = c.proxy
        ),
    )
    .unwrap();
    c.sallyctl(&["create", &f.display().to_string()]).ok();
}

/// Roles sso-ops (root everywhere) and db-readers (the login from the email's local part).
pub fn roles_file(c: &Cluster) {
    let f = c.dir.path().join("sso-roles.yaml");
    std::fs::write(
        &f,
        "kind: role\nversion: v1\nmetadata: {name: sso-ops}\nspec:\n  allow:\n    logins: [root]\n    node_labels: {'*': '*'}\n---\nkind: role\nversion: v1\nmetadata: {name: db-readers}\nspec:\n  allow:\n    logins: ['{{email.local(external.email)}}']\n",
    )
    .unwrap();
    c.sallyctl(&["create", &f.display().to_string()]).ok();
}
