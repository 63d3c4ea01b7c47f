//! `sally`: the user's client. Sign up, log in once, and hold short-lived certificates.

use std::process::ExitCode;

use anyhow::{Context, Result, anyhow, bail};
use clap::{Parser, Subcommand, ValueEnum};
use russh::keys::ssh_key::{Algorithm, LineEnding, PrivateKey};
use sallyport_cli::http::Api;
use sallyport_cli::profile::{self, Profile};
use sallyport_cli::prompt::Input;
use sallyport_core::api::*;
use sallyport_core::tls::Trust;

#[derive(Parser)]
#[command(
    name = "sally",
    version,
    about = "Sallyport client: log in once, reach every server you are allowed to"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, ValueEnum, PartialEq, Eq)]
enum Format {
    Text,
    Json,
}

#[derive(clap::Args)]
struct Trusting {
    /// Pin of the cluster's CA (`sha256:<hex>`, printed by `sallyport start`).
    #[arg(long)]
    ca_pin: Option<String>,
    /// Do not verify the proxy's certificate (only for testing).
    #[arg(long, conflicts_with = "ca_pin")]
    insecure: bool,
}

#[derive(Subcommand)]
enum Command {
    /// Set your password and enroll your authenticator with a sign-up token.
    Signup {
        #[arg(long)]
        proxy: String,
        #[arg(long)]
        token: String,
        #[command(flatten)]
        trust: Trusting,
    },
    /// Log in and receive short-lived SSH and X.509 certificates.
    Login {
        #[arg(long)]
        proxy: String,
        #[arg(long)]
        user: String,
        /// Certificate lifetime, e.g. 8h (capped by your roles' max_session_ttl).
        #[arg(long)]
        ttl: Option<String>,
        #[command(flatten)]
        trust: Trusting,
    },
    /// Show who you are logged in as and until when.
    Status {
        #[arg(long, value_enum, default_value = "text")]
        format: Format,
    },
    /// Remove your keys and certificates.
    Logout,
}

fn main() -> ExitCode {
    sallyport_core::install_crypto_provider();
    let cli = Cli::parse();
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(sallyport_cli::EXIT_FAILURE);
        }
    };
    match rt.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::from(sallyport_cli::EXIT_FAILURE)
        }
    }
}

async fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Signup {
            proxy,
            token,
            trust,
        } => signup(&proxy, &token, &trust).await,
        Command::Login {
            proxy,
            user,
            ttl,
            trust,
        } => login(&proxy, &user, ttl.as_deref(), &trust).await,
        Command::Status { format } => status(format),
        Command::Logout => {
            if profile::remove_all()? {
                println!(
                    "Logged out: keys and certificates removed from {}",
                    profile::home().display()
                );
            } else {
                println!("Not logged in.");
            }
            Ok(())
        }
    }
}

/// How to trust the proxy: the pin or `--insecure` given now, else the CA saved at a login.
fn trust_for(proxy: &str, t: &Trusting) -> Result<Trust> {
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
    bail!(
        "first contact with {proxy}: pass --ca-pin sha256:... (printed by `sallyport start` and `sallyctl status`), or --insecure for a test cluster"
    )
}

async fn signup(proxy: &str, token: &str, t: &Trusting) -> Result<()> {
    let api = Api::new(proxy, "the proxy", trust_for(proxy, t)?, None, None)?;
    let ping: Ping = api.get("/v1/webapi/ping").await?;
    let mut input = Input::new();
    // Check the token before asking for anything.
    let started: SignupStarted = api
        .post(
            "/v1/webapi/signup/start",
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
            "/v1/webapi/signup/finish",
            &SignupFinish {
                token: token.into(),
                password,
                otp_code,
            },
        )
        .await?;
    eprintln!(
        "Signed up as {}. Log in with:\n  sally login --proxy {proxy} --user {}",
        started.user, started.user
    );
    Ok(())
}

async fn login(proxy: &str, user: &str, ttl: Option<&str>, t: &Trusting) -> Result<()> {
    let ttl_secs = ttl
        .map(|s| sallyport_core::duration::parse(s).map(|d| d.as_secs()))
        .transpose()
        .map_err(|e| anyhow!("--ttl: {e}"))?;
    let api = Api::new(proxy, "the proxy", trust_for(proxy, t)?, None, None)?;
    let ping: Ping = api.get("/v1/webapi/ping").await?;
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
            "/v1/webapi/login",
            &LoginRequest {
                user: user.into(),
                password,
                otp_code,
                ssh_public_key: public.clone(),
                ttl_secs,
                remote_addr: None,
            },
        )
        .await?;
    let profile = Profile {
        proxy: proxy.into(),
        user: certs.user.clone(),
        cluster: certs.cluster_name.clone(),
        roles: certs.roles.clone(),
        logins: certs.logins.clone(),
        valid_until: certs.valid_until.clone(),
        tls_host_ca_pem: certs.tls_host_ca_pem.clone(),
    };
    save_keys(&profile, &key, &public, &certs)?;
    profile.save()?;
    print_status(&profile);
    Ok(())
}

fn save_keys(p: &Profile, key: &PrivateKey, public: &str, certs: &Certs) -> Result<()> {
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

fn print_status(p: &Profile) {
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

fn status(format: Format) -> Result<()> {
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
