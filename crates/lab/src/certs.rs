//! The lab's TLS material: a throw-away CA and two certificates it signs, one for the
//! nodes and one for holdfast's listeners, both valid for `127.0.0.1` and `localhost`.
//! ECDSA P-256 keys; files in `DIR/tls/`, keys mode 0600. The CA's key is not kept.

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose, SanType,
};
use std::fs;
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

/// Where the lab's TLS files are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LabTls {
    pub ca: PathBuf,
    pub node_cert: PathBuf,
    pub node_key: PathBuf,
    pub holdfast_cert: PathBuf,
    pub holdfast_key: PathBuf,
}

impl LabTls {
    pub fn in_dir(dir: &Path) -> LabTls {
        LabTls {
            ca: dir.join("ca.pem"),
            node_cert: dir.join("node.pem"),
            node_key: dir.join("node-key.pem"),
            holdfast_cert: dir.join("holdfast.pem"),
            holdfast_key: dir.join("holdfast-key.pem"),
        }
    }

    /// The `mariadbd` options that give a node its certificate (TLS offered, not required).
    pub fn server_args(&self) -> Vec<String> {
        vec![
            format!("--ssl-ca={}", self.ca.display()),
            format!("--ssl-cert={}", self.node_cert.display()),
            format!("--ssl-key={}", self.node_key.display()),
        ]
    }
}

/// Creates a CA and the node and holdfast certificates in `dir` (created if needed).
pub fn generate(dir: &Path) -> Result<LabTls> {
    fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let files = LabTls::in_dir(dir);
    let ca_key = KeyPair::generate().context("generating the lab CA key")?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name
        .push(DnType::CommonName, "holdfast lab CA");
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let ca_cert = ca.self_signed(&ca_key).context("signing the lab CA")?;
    write(&files.ca, ca_cert.pem().as_bytes(), 0o644)?;
    for (name, cert_path, key_path) in [
        ("holdfast lab node", &files.node_cert, &files.node_key),
        ("holdfast", &files.holdfast_cert, &files.holdfast_key),
    ] {
        let key = KeyPair::generate().context("generating a lab key")?;
        let mut params = CertificateParams::new(vec!["localhost".to_string()])?;
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, name);
        // Strict verifiers (OpenSSL's X509_STRICT, Python 3.13's default) want it.
        params.use_authority_key_identifier_extension = true;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        let cert = params
            .signed_by(&key, &ca_cert, &ca_key)
            .with_context(|| format!("signing the {name} certificate"))?;
        write(cert_path, cert.pem().as_bytes(), 0o644)?;
        write(key_path, key.serialize_pem().as_bytes(), 0o600)?;
    }
    Ok(files)
}

fn write(path: &Path, contents: &[u8], mode: u32) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let _ = fs::remove_file(path);
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .with_context(|| format!("creating {}", path.display()))?;
    f.write_all(contents)
        .with_context(|| format!("writing {}", path.display()))
}
