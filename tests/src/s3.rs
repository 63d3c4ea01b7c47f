//! A real S3 API on loopback for the recording-store tests: `moto_server` (PyPI `moto[server]`,
//! installed by `scripts/test`) on a port picked for it, driven with `curl`'s SigV4 (moto takes
//! any key unless it is told to check credentials).

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A running `moto_server`, killed when dropped.
pub struct Moto {
    child: Option<Child>,
    pub port: u16,
    /// `http://127.0.0.1:PORT`: the `endpoint` of a `recordings:` section.
    pub endpoint: String,
}

/// The credentials every test daemon is given (moto takes any unless told to check).
pub fn credentials() -> Vec<(String, String)> {
    vec![
        ("AWS_ACCESS_KEY_ID".into(), "AKIDSALLYPORTTEST".into()),
        (
            "AWS_SECRET_ACCESS_KEY".into(),
            "sallyport-test-secret-never-logged".into(),
        ),
    ]
}

impl Moto {
    /// On a free port.
    pub fn start() -> Moto {
        Self::start_on(crate::free_port())
    }

    /// On `port` (a test that starts it only after the daemon tried to reach it).
    pub fn start_on(port: u16) -> Moto {
        Self::spawn(port, false)
    }

    /// One that checks credentials and knows none: every request is refused
    /// (`InvalidAccessKeyId`), as a store given the wrong key would.
    pub fn start_checking_credentials() -> Moto {
        Self::spawn(crate::free_port(), true)
    }

    fn spawn(port: u16, check: bool) -> Moto {
        let mut cmd = Command::new("moto_server");
        if check {
            cmd.env("INITIAL_NO_AUTH_ACTION_COUNT", "0");
        }
        let child = cmd
            .args(["-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto_server (pip install 'moto[server]'; scripts/test installs it)");
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "moto_server did not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
        Moto {
            child: Some(child),
            port,
            endpoint: format!("http://127.0.0.1:{port}"),
        }
    }

    /// curl, signing as [`credentials`] (moto refuses anonymous object requests).
    fn curl(&self, args: &[&str]) -> std::process::Output {
        let creds = credentials();
        Command::new("curl")
            .args([
                "-sS",
                "--fail-with-body",
                "--aws-sigv4",
                "aws:amz:us-east-1:s3",
            ])
            .arg("--user")
            .arg(format!("{}:{}", creds[0].1, creds[1].1))
            .args(args)
            .output()
            .expect("curl")
    }

    /// Creates `bucket` through the S3 API (`PUT /bucket`).
    pub fn bucket(&self, bucket: &str) {
        let out = self.curl(&["-X", "PUT", &format!("{}/{bucket}", self.endpoint)]);
        assert!(out.status.success(), "{out:?}");
    }

    /// The keys under `prefix` in `bucket`, with their sizes.
    pub fn list(&self, bucket: &str, prefix: &str) -> Vec<(String, u64)> {
        let out = self.curl(&[&format!("{}/{bucket}?prefix={prefix}", self.endpoint)]);
        assert!(out.status.success(), "{out:?}");
        let xml = String::from_utf8_lossy(&out.stdout).into_owned();
        xml.split("<Contents>")
            .skip(1)
            .map(|c| {
                let field = |name: &str| {
                    c.split(&format!("<{name}>"))
                        .nth(1)
                        .and_then(|r| r.split(&format!("</{name}>")).next())
                        .unwrap_or_default()
                        .to_string()
                };
                (field("Key"), field("Size").parse().unwrap_or(0))
            })
            .collect()
    }

    /// Object `key` of `bucket`, whole (small objects only).
    pub fn get(&self, bucket: &str, key: &str) -> Vec<u8> {
        let out = self.curl(&[&format!("{}/{bucket}/{key}", self.endpoint)]);
        assert!(out.status.success(), "{out:?}");
        out.stdout
    }

    /// Stores the file `from` as `key` in `bucket`, streamed by curl.
    pub fn put_file(&self, bucket: &str, key: &str, from: &Path) {
        let out = self.curl(&[
            "-X",
            "PUT",
            "-T",
            &from.display().to_string(),
            &format!("{}/{bucket}/{key}", self.endpoint),
        ]);
        assert!(out.status.success(), "{out:?}");
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
