//! A private `redis-server` that speaks only TLS (`--port 0 --tls-port <port>`), with the
//! certificates the test generates (rcgen): a CA, a server certificate it signed for
//! `127.0.0.1` and `localhost`, a client certificate it signed (mutual TLS), and an unrelated
//! CA that signed nothing (a wrong `redis_tls_ca`). Killed on drop.
#![allow(dead_code)]

use super::redis_server::free_port;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The generated PEM files, in a temporary directory.
pub struct Pki {
    dir: tempfile::TempDir,
    /// The CA that signed the server and client certificates.
    pub ca: PathBuf,
    /// A CA that signed nothing here.
    pub other_ca: PathBuf,
    /// The server's certificate and key.
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    /// A client certificate and key, signed by `ca`.
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
}

fn new_ca(name: &str) -> (String, Issuer<'static, KeyPair>) {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let key = KeyPair::generate().expect("CA key");
    let cert = params.self_signed(&key).expect("CA certificate");
    (cert.pem(), Issuer::new(params, key))
}

fn leaf(
    issuer: &Issuer<'static, KeyPair>,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
) -> (String, String) {
    let names: Vec<String> = names.iter().map(|s| s.to_string()).collect();
    let mut params = CertificateParams::new(names).expect("leaf params");
    params
        .distinguished_name
        .push(DnType::CommonName, "agui-fanout test");
    params.use_authority_key_identifier_extension = true;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![usage];
    let key = KeyPair::generate().expect("leaf key");
    let cert = params.signed_by(&key, issuer).expect("leaf certificate");
    (cert.pem(), key.serialize_pem())
}

impl Pki {
    /// Generates every file.
    pub fn generate() -> Pki {
        let dir = tempfile::tempdir().expect("temp dir");
        let write = |name: &str, pem: &str| {
            let path = dir.path().join(name);
            std::fs::write(&path, pem).expect("write PEM");
            path
        };
        let (ca_pem, issuer) = new_ca("agui-fanout test CA");
        let (other_pem, _) = new_ca("some other CA");
        let (server_pem, server_key) = leaf(
            &issuer,
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
        );
        let (client_pem, client_key) = leaf(
            &issuer,
            &["agui-fanout"],
            ExtendedKeyUsagePurpose::ClientAuth,
        );
        Pki {
            ca: write("ca.pem", &ca_pem),
            other_ca: write("other-ca.pem", &other_pem),
            server_cert: write("server.pem", &server_pem),
            server_key: write("server-key.pem", &server_key),
            client_cert: write("client.pem", &client_pem),
            client_key: write("client-key.pem", &client_key),
            dir,
        }
    }

    /// The directory holding the files.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }
}

/// A TLS-only `redis-server` child.
pub struct TlsRedis {
    port: u16,
    child: Child,
    _dir: tempfile::TempDir,
}

impl TlsRedis {
    /// Starts a server with `pki`'s server certificate on a free port, asking clients for a
    /// certificate signed by `pki.ca` when `client_certs`; waits until it answers `PING` over
    /// TLS (panics after 10 s).
    pub async fn start(pki: &Pki, client_certs: bool) -> TlsRedis {
        let binary =
            std::env::var("AGUI_TEST_REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        for _ in 0..5 {
            let port = free_port();
            let dir = tempfile::tempdir().expect("temp dir");
            let child = Command::new(&binary)
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(["--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no"])
                .arg("--tls-cert-file")
                .arg(&pki.server_cert)
                .arg("--tls-key-file")
                .arg(&pki.server_key)
                .arg("--tls-ca-cert-file")
                .arg(&pki.ca)
                .args([
                    "--tls-auth-clients",
                    if client_certs { "yes" } else { "no" },
                ])
                .arg("--dir")
                .arg(dir.path())
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server (is it installed, built with TLS?)");
            let mut server = TlsRedis {
                port,
                child,
                _dir: dir,
            };
            if server.wait_ready(pki).await {
                return server;
            }
        }
        panic!("could not start a TLS redis-server");
    }

    /// `rediss://127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// A client of this server trusting `pki.ca`, with `pki`'s client certificate.
    pub fn client(&self, pki: &Pki) -> redis::Client {
        let _ = rustls::crypto::ring::default_provider().install_default();
        redis::Client::build_with_tls(
            self.url(),
            redis::TlsCertificates {
                client_tls: Some(redis::ClientTlsConfig {
                    client_cert: std::fs::read(&pki.client_cert).unwrap(),
                    client_key: std::fs::read(&pki.client_key).unwrap(),
                }),
                root_cert: Some(std::fs::read(&pki.ca).unwrap()),
            },
        )
        .expect("TLS client")
    }

    /// Runs one command over TLS; its reply as text (integers in decimal).
    pub async fn command(&self, pki: &Pki, args: &[&str]) -> String {
        super::redis_server::command_on(&self.client(pki), args).await
    }

    async fn wait_ready(&mut self, pki: &Pki) -> bool {
        let client = self.client(pki);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            let ping = async {
                let mut conn = client.get_multiplexed_async_connection().await.ok()?;
                redis::cmd("PING")
                    .query_async::<String>(&mut conn)
                    .await
                    .ok()
            };
            if let Ok(Some(_)) = tokio::time::timeout(Duration::from_millis(500), ping).await {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }
}

impl Drop for TlsRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
