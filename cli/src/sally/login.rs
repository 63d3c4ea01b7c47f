//! `sally signup`, `login` (local or SSO), `status` and `logout`: how the client comes to trust
//! the proxy, and the keys and certificates a login leaves under `$SALLY_HOME`.

use anyhow::{Context, Result, anyhow, bail};
use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_core::api::*;
use sallyport_core::routes;
use sallyport_core::tls::Trust;

use super::{Format, Trusting};
use crate::http::Api;
use crate::println;
use crate::profile::{self, Profile};
use crate::prompt::Input;

/// How to trust the proxy: the pin or `--insecure` given now, else the CA saved at a login.
pub(super) fn trust_for(proxy: &str, t: &Trusting) -> Result<Trust> {
    if t.insecure {
        eprintln!("WARNING: --insecure: the proxy's identity is not checked");
        return Ok(Trust::Insecure);
    }
    if let Some(pin) = &t.ca_pin {
        let hex = pin.strip_prefix("sha256:").unwrap_or("");
        if hex.len() != 64 || !hex.bytes().all(|b| b.is_ascii_hexdigit()) {
            bail!("--ca-pin must look like sha256:<64 hex digits>, as `sallyport start` prints it");
        }
        return Ok(Trust::Pin(pin.to_ascii_lowercase()));
    }
    if let Some(p) = Profile::load()?.filter(|p| p.proxy == proxy) {
        let cas = sallyport_core::x509::pem_to_ders(&p.tls_host_ca_pem)?;
        return Ok(Trust::Roots(cas));
    }
    // A sign-up checked this proxy against a pin: the login it printed trusts the same.
    if let Some(pin) = crate::profile::saved_pin(proxy)?.filter(|p| {
        p.strip_prefix("sha256:")
            .is_some_and(|h| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    }) {
        return Ok(Trust::Pin(pin));
    }
    bail!(
        "first contact with {proxy}: pass --ca-pin sha256:... (printed by `sallyport start` and `sallyctl status`), or --insecure for a test cluster"
    )
}

pub(super) async fn signup(proxy: &str, token: &str, t: &Trusting) -> Result<()> {
    let trust = trust_for(proxy, t)?;
    let pinned = match &trust {
        Trust::Pin(pin) => Some(pin.clone()),
        _ => None,
    };
    let api = Api::new(proxy, "the proxy", trust, None, None)?;
    let ping: Ping = api.get(routes::web::PING).await?;
    let mut input = Input::new();
    // Check the token before asking for anything.
    let started: SignupStarted = api
        .post(
            routes::web::SIGNUP_START,
            &SignupStart {
                token: token.into(),
            },
        )
        .await?;
    let password = if input.is_tty() {
        eprintln!(
            "Signing up {} on cluster {}",
            started.user, ping.cluster_name
        );
        let p = input.secret("New password: ", "password")?;
        let again = input.secret("Repeat password: ", "password")?;
        if p != again {
            bail!("the passwords differ; nothing was changed");
        }
        p
    } else {
        input.secret("", "password")?
    };
    let mut otp_code = None;
    if let Some(uri) = &started.otpauth_uri {
        if input.is_tty() {
            eprintln!("\nScan this code with your authenticator app (or enter the URI below):\n");
            if let Ok(qr) = qrcode::QrCode::new(uri.as_bytes()) {
                eprintln!(
                    "{}",
                    qr.render::<qrcode::render::unicode::Dense1x2>()
                        .quiet_zone(true)
                        .build()
                );
            }
        }
        println!("{uri}");
        otp_code = Some(input.line("Code from your authenticator: ", "one-time code")?);
    }
    let _: serde_json::Value = api
        .post(
            routes::web::SIGNUP_FINISH,
            &SignupFinish {
                token: token.into(),
                password,
                otp_code,
            },
        )
        .await?;
    // The pin verified this proxy for the sign-up; the login below trusts it the same way.
    if let Some(pin) = pinned {
        crate::profile::save_pin(proxy, &pin)?;
    }
    eprintln!(
        "Signed up as {}. Log in with:\n  sally login --proxy {proxy} --user {}",
        started.user, started.user
    );
    Ok(())
}

pub(super) async fn login(
    proxy: &str,
    user: Option<String>,
    auth: Option<String>,
    no_browser: bool,
    ttl: Option<&str>,
    t: &Trusting,
) -> Result<()> {
    let ttl_secs = ttl
        .map(|s| sallyport_core::duration::parse(s).map(|d| d.as_secs()))
        .transpose()
        .map_err(|e| anyhow!("--ttl: {e}"))?;
    let api = Api::new(proxy, "the proxy", trust_for(proxy, t)?, None, None)?;
    let ping: Ping = api.get(routes::web::PING).await?;
    let user = match (user, auth) {
        (Some(u), _) => u,
        (None, Some(connector)) => {
            return sso_login(&api, proxy, &connector, no_browser, ttl_secs).await;
        }
        (None, None) => match ping.auth_connectors.as_slice() {
            [only] if !ping.local_users => {
                return sso_login(&api, proxy, only, no_browser, ttl_secs).await;
            }
            [] => bail!("give --user NAME"),
            names => bail!(
                "give --user NAME for a local login, or --auth with one of: {}",
                names.join(", ")
            ),
        },
    };
    let user = user.as_str();
    let mut input = Input::new();
    let password = input.secret(&format!("Password for {user}: "), "password")?;
    let otp_code = if ping.second_factor == "otp" {
        Some(input.line("One-time code: ", "one-time code")?)
    } else {
        None
    };
    // The private key is made here and never leaves this machine.
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .context("cannot generate a key")?;
    let public = key.public_key().to_openssh()?;
    let certs: Certs = api
        .post(
            routes::web::LOGIN,
            &LoginRequest {
                user: user.into(),
                password,
                otp_code,
                ssh_public_key: public.clone(),
                ttl_secs,
                remote_addr: None,
                web: false,
            },
        )
        .await?;
    finish_login(proxy, &key, &public, &certs)
}

/// `sally login --auth=NAME`: the authorization-code flow through the proxy, finished by the
/// browser at this machine's loopback listener.
pub(super) async fn sso_login(
    api: &Api,
    proxy: &str,
    connector: &str,
    no_browser: bool,
    ttl_secs: Option<u64>,
) -> Result<()> {
    let key = PrivateKey::random(&mut rand::rng(), Algorithm::Ed25519)
        .context("cannot generate a key")?;
    let public = key.public_key().to_openssh()?;
    let listener = crate::sso::Listener::bind().await?;
    let client_key = sallyport_core::random_hex(32);
    let started: serde_json::Value = api
        .post(
            routes::web::OIDC_LOGIN_START,
            &serde_json::json!({
                "connector": connector,
                "client_redirect_url": listener.redirect_url,
                "ssh_public_key": public,
                "ttl_secs": ttl_secs,
                "client_key": client_key,
            }),
        )
        .await?;
    let url = started["auth_url"]
        .as_str()
        .ok_or_else(|| anyhow!("the proxy gave no sign-in URL"))?;
    if no_browser || crate::sso::open_browser(url).is_err() {
        eprintln!("Open this URL in a browser to sign in:\n");
    } else {
        eprintln!("A browser opened to sign in; if it did not, open this URL:\n");
    }
    // On stdout alone, so scripts (and tests) can read it.
    println!("{url}");
    use std::io::Write;
    let _ = std::io::stdout().flush();
    let outcome = listener
        .wait(std::time::Duration::from_secs(login_timeout()))
        .await?;
    let response = match outcome {
        crate::sso::Outcome::Response(r) => r,
        crate::sso::Outcome::Error(e) => bail!("sign-in failed: {e}"),
    };
    let certs: Certs = api
        .post(
            routes::web::OIDC_LOGIN_FINISH,
            &serde_json::json!({"response": response, "client_key": client_key}),
        )
        .await?;
    finish_login(proxy, &key, &public, &certs)
}

/// Saves what a login (local or SSO) brought: keys, certificates and the profile.
pub(super) fn finish_login(
    proxy: &str,
    key: &PrivateKey,
    public: &str,
    certs: &Certs,
) -> Result<()> {
    let profile = Profile {
        proxy: proxy.into(),
        user: certs.user.clone(),
        cluster: certs.cluster_name.clone(),
        roles: certs.roles.clone(),
        logins: certs.logins.clone(),
        valid_until: certs.valid_until.clone(),
        tls_host_ca_pem: certs.tls_host_ca_pem.clone(),
    };
    save_keys(&profile, key, public, certs)?;
    profile.save()?;
    print_status(&profile);
    Ok(())
}

pub(super) fn save_keys(p: &Profile, key: &PrivateKey, public: &str, certs: &Certs) -> Result<()> {
    let paths = p.paths();
    let _ = profile::remove_all();
    profile::ensure_private_dir(&profile::home())?;
    profile::ensure_private_dir(&profile::home().join("keys"))?;
    profile::ensure_private_dir(&paths.dir)?;
    let seed = key
        .key_data()
        .ed25519()
        .map(|k| k.private.to_bytes())
        .ok_or_else(|| anyhow!("generated key is not Ed25519"))?;
    let pkcs8 = sallyport_core::x509::ed25519_pkcs8(&seed);
    profile::write_file(
        &paths.key,
        key.to_openssh(LineEnding::LF)?.as_bytes(),
        0o600,
    )?;
    profile::write_file(&paths.public, format!("{public}\n").as_bytes(), 0o644)?;
    profile::write_file(
        &paths.ssh_cert,
        format!("{}\n", certs.ssh_cert.trim_end()).as_bytes(),
        0o644,
    )?;
    profile::write_file(
        &paths.tls_key,
        sallyport_core::x509::to_pem("PRIVATE KEY", &pkcs8).as_bytes(),
        0o600,
    )?;
    profile::write_file(&paths.tls_cert, certs.tls_cert_pem.as_bytes(), 0o644)?;
    let known: String = certs.known_hosts.iter().map(|l| format!("{l}\n")).collect();
    profile::write_file(
        &profile::home().join("known_hosts"),
        known.as_bytes(),
        0o644,
    )?;
    Ok(())
}

pub(super) fn print_status(p: &Profile) {
    let paths = p.paths();
    let left = p
        .expires()
        .map(|e| e - sallyport_core::unix_now())
        .unwrap_or(0);
    let validity = if left > 0 {
        format!(
            "valid until {} ({} left)",
            p.valid_until,
            sallyport_core::duration::format(std::time::Duration::from_secs(left as u64))
        )
    } else {
        format!("EXPIRED at {}; run `sally login`", p.valid_until)
    };
    println!("> Profile: {}", p.proxy);
    println!("  Logged in as: {}", p.user);
    println!("  Cluster:      {}", p.cluster);
    println!("  Roles:        {}", p.roles.join(", "));
    println!(
        "  Logins:       {}",
        if p.logins.is_empty() {
            "(none)".into()
        } else {
            p.logins.join(", ")
        }
    );
    println!("  Valid:        {validity}");
    println!("  Key:          {}", paths.key.display());
    println!("  SSH cert:     {}", paths.ssh_cert.display());
    println!("  X.509 cert:   {}", paths.tls_cert.display());
}

pub(super) fn status(format: Format) -> Result<()> {
    let p = Profile::require()?;
    if format == Format::Json {
        let paths = p.paths();
        let v = serde_json::json!({
            "user": p.user,
            "roles": p.roles,
            "logins": p.logins,
            "valid_until": p.valid_until,
            "proxy": p.proxy,
            "cluster": p.cluster,
            "key_path": paths.key,
            "ssh_cert_path": paths.ssh_cert,
            "tls_cert_path": paths.tls_cert,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        print_status(&p);
    }
    Ok(())
}

/// How long `sally login --auth` waits for the browser (`SALLY_LOGIN_TIMEOUT` seconds; 300).
pub(super) fn login_timeout() -> u64 {
    std::env::var("SALLY_LOGIN_TIMEOUT")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}
