//! The systemd unit and the `.deb` (`cargo deb -p holdfast`): the unit is one systemd reads
//! without complaint, and it runs the binary and the config the package installs.

use std::path::{Path, PathBuf};
use std::process::Command;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn unit() -> String {
    std::fs::read_to_string(repo().join("packaging/holdfast.service")).expect("the unit")
}

/// The `[package.metadata.deb]` table of this crate.
fn deb() -> toml::Table {
    let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml"))
        .expect("Cargo.toml");
    let manifest: toml::Table = text.parse().expect("Cargo.toml is TOML");
    manifest["package"]["metadata"]["deb"]
        .as_table()
        .expect("[package.metadata.deb]")
        .clone()
}

/// Each asset as (source, destination).
fn assets() -> Vec<(String, String)> {
    deb()["assets"]
        .as_array()
        .expect("assets")
        .iter()
        .map(|a| {
            let a = a
                .as_array()
                .expect("an asset is [source, destination, mode]");
            let s = |i: usize| a[i].as_str().expect("a string").to_string();
            (s(0), s(1))
        })
        .collect()
}

#[test]
fn the_unit_runs_the_binary_and_config_the_package_installs() {
    let unit = unit();
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    assert_eq!(
        exec,
        "/usr/bin/holdfast serve --config /etc/holdfast/holdfast.toml"
    );
    assert!(
        unit.contains("\nExecReload=/bin/kill -HUP $MAINPID\n"),
        "reload is SIGHUP"
    );
    assert!(unit.contains("\nRestart=on-failure\n"));
    assert!(unit.contains("\nUser=holdfast\n"));
    let assets = assets();
    let installs = |dest: &str| assets.iter().any(|(_, d)| d == dest);
    assert!(
        installs("usr/bin/"),
        "the binary goes to /usr/bin: {assets:?}"
    );
    assert!(installs("etc/holdfast/holdfast.toml"), "{assets:?}");
    let conf_files = deb()["conf-files"].as_array().expect("conf-files").clone();
    assert!(
        conf_files
            .iter()
            .any(|c| c.as_str() == Some("/etc/holdfast/holdfast.toml")),
        "the config survives an upgrade of the package: {conf_files:?}"
    );
    // Every source file is in the repository (the binary is built by `cargo deb`).
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    for (source, _) in assets.iter().filter(|(s, _)| !s.starts_with("target/")) {
        assert!(
            crate_dir.join(source).is_file(),
            "asset {source} is missing"
        );
    }
    for script in ["postinst", "postrm"] {
        let text = std::fs::read_to_string(repo().join("packaging/debian").join(script))
            .unwrap_or_else(|e| panic!("{script}: {e}"));
        assert!(
            text.contains("#DEBHELPER#"),
            "{script} leaves room for the unit's snippets"
        );
    }
}

/// systemd reads the unit without a warning (an unknown key or a bad value is a warning
/// systemd ignores: the hardening would silently not apply).
#[test]
fn systemd_reads_the_unit_without_a_warning() {
    if Command::new("systemd-analyze")
        .arg("--version")
        .output()
        .is_err()
    {
        eprintln!("skipped: systemd-analyze is not installed (apt-get install systemd)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("holdfast-unit-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    // The binary under test where the package puts /usr/bin/holdfast (verify checks it).
    let text = unit().replace("/usr/bin/holdfast", env!("CARGO_BIN_EXE_holdfast"));
    let path = dir.join("holdfast.service");
    std::fs::write(&path, text).expect("write the unit");
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no"])
        .arg(&path)
        .output()
        .expect("systemd-analyze");
    let _ = std::fs::remove_dir_all(&dir);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success() && stderr.trim().is_empty(),
        "systemd-analyze verify: {stderr}"
    );
}
