//! A lean reference relay for `bench/kube.sh`: what the proxy and the kube agent must at least
//! do, and nothing else. Each connection it accepts is copied to its upstream and back, both
//! directions at once (`tokio::io::copy_bidirectional`, 256 KiB buffers) — unlike socat, whose
//! one loop blocks a direction while it writes the other.
//!
//! `relay tcp LISTEN_PORT UPSTREAM_PORT`: bytes only (TLS goes through it end to end).
//! `relay tls LISTEN_PORT UPSTREAM_PORT CERT KEY UPSTREAM_CA [CLIENT_CERT CLIENT_KEY]`: ends
//! TLS from its client (CERT, KEY) and starts TLS to the upstream (verified against UPSTREAM_CA
//! for 127.0.0.1, with a client certificate if given), on 127.0.0.1, with the crypto the proxy
//! uses (rustls, aws-lc). No ALPN: HTTP/1.1 on both legs, as kubectl's exec is.

use std::sync::Arc;

use anyhow::{Context, Result, bail};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpListener, TcpStream};

const BUF: usize = 256 * 1024;

struct Tls {
    acceptor: tokio_rustls::TlsAcceptor,
    connector: tokio_rustls::TlsConnector,
}

fn certs(path: &str) -> Result<Vec<CertificateDer<'static>>> {
    CertificateDer::pem_file_iter(path)
        .with_context(|| format!("reading {path}"))?
        .collect::<Result<Vec<_>, _>>()
        .with_context(|| format!("certificates in {path}"))
}

fn key(path: &str) -> Result<PrivateKeyDer<'static>> {
    PrivateKeyDer::from_pem_file(path).with_context(|| format!("the key in {path}"))
}

fn tls(a: &[String]) -> Result<Tls> {
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(certs(&a[0])?, key(&a[1])?)?;
    let mut roots = rustls::RootCertStore::empty();
    for ca in certs(&a[2])? {
        roots.add(ca)?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots);
    let client = match (a.get(3), a.get(4)) {
        (Some(c), Some(k)) => builder.with_client_auth_cert(certs(c)?, key(k)?)?,
        _ => builder.with_no_client_auth(),
    };
    Ok(Tls {
        acceptor: tokio_rustls::TlsAcceptor::from(Arc::new(server)),
        connector: tokio_rustls::TlsConnector::from(Arc::new(client)),
    })
}

async fn copy<A, B>(mut a: A, mut b: B) -> Result<()>
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    tokio::io::copy_bidirectional_with_sizes(&mut a, &mut b, BUF, BUF).await?;
    Ok(())
}

async fn serve(conn: TcpStream, upstream: u16, tls: Option<Arc<Tls>>) -> Result<()> {
    conn.set_nodelay(true)?;
    let up = TcpStream::connect(("127.0.0.1", upstream)).await?;
    up.set_nodelay(true)?;
    match tls {
        None => copy(conn, up).await,
        Some(t) => {
            let conn = t.acceptor.accept(conn).await?;
            let name = ServerName::IpAddress(std::net::Ipv4Addr::LOCALHOST.into());
            let up = t.connector.connect(name, up).await?;
            copy(conn, up).await
        }
    }
}

async fn run(a: Vec<String>) -> Result<()> {
    const USAGE: &str = "usage: relay tcp LISTEN UPSTREAM | relay tls LISTEN UPSTREAM CERT KEY CA [CLIENT_CERT CLIENT_KEY]";
    let port = |what: &str, p: &str| {
        p.parse::<u16>()
            .with_context(|| format!("{what} port {p:?} is not a port"))
    };
    let (mode, listen, upstream) = match a.as_slice() {
        [m, l, u, ..] => (
            m.as_str(),
            port("the listening", l)?,
            port("the upstream", u)?,
        ),
        _ => bail!(USAGE),
    };
    let tls = match (mode, a.len()) {
        ("tcp", 3) => None,
        ("tls", 6 | 8) => Some(Arc::new(tls(&a[3..])?)),
        _ => bail!(USAGE),
    };
    let listener = TcpListener::bind(("127.0.0.1", listen))
        .await
        .with_context(|| format!("listening on 127.0.0.1:{listen}"))?;
    loop {
        let conn = match listener.accept().await {
            Ok((conn, _)) => conn,
            // Out of descriptors, a connection reset before it was taken: not the relay's end.
            Err(e) => {
                eprintln!("relay: accept: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let tls = tls.clone();
        tokio::spawn(async move {
            if let Err(e) = serve(conn, upstream, tls).await {
                eprintln!("relay: {e:#}");
            }
        });
    }
}

fn main() -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("relay: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match rt.block_on(run(std::env::args().skip(1).collect())) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("relay: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
