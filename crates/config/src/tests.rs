use super::serverless::{ExecDriverConfig, InstanceDriverConfig, ProcessDriverConfig, ScalePolicy};
use super::*;
use std::collections::BTreeSet;

const EXAMPLE: &str = include_str!("../../../holdfast.example.toml");
const SERVERLESS_EXAMPLE: &str = include_str!("../../../holdfast.serverless.example.toml");

#[test]
fn example_config_parses() {
    let cfg = Config::parse(EXAMPLE, "example").unwrap();
    assert_eq!(cfg.backends.len(), 1);
    assert_eq!(cfg.proxy.max_packet_size, 64 << 20);
    assert_eq!(cfg.driver.kind, DriverKind::None);
    // The example documents [admin] and [driver] with their default values.
    assert_eq!(cfg.admin, AdminConfig::default());
    assert_eq!(cfg.driver, DriverConfig::default());
    // The example documents every [ha] key with its default value.
    let defaults = HaConfig::default();
    assert_eq!(cfg.ha.mode, HaMode::External);
    assert_eq!(format!("{:?}", cfg.ha), format!("{defaults:?}"));
    assert_eq!(cfg.ha, defaults);
}

#[test]
fn serverless_example_config_parses() {
    let cfg = Config::parse(SERVERLESS_EXAMPLE, "serverless example").unwrap();
    let sl = cfg.serverless.expect("[serverless]");
    assert_eq!(sl.idle_pause_secs, 300);
    assert_eq!(sl.pause_tier, PauseTier::Freeze);
    assert_eq!(sl.scale, ScalePolicy::default());
    assert!(matches!(sl.driver, InstanceDriverConfig::Process(_)));
    assert_eq!(cfg.listeners.len(), 1);
    assert_eq!(cfg.listeners[0].mode, ListenerMode::Passthrough);
}

#[test]
fn serverless_needs_one_backend_and_external_ha() {
    let two = SERVERLESS_EXAMPLE.replace(
        "[serverless]\n",
        "[[backend]]\nname = \"b\"\naddress = \"127.0.0.1:1\"\n\n[serverless]\n",
    );
    let err = Config::parse(&two, "t").unwrap_err().to_string();
    assert!(err.contains("exactly one [[backend]]"), "{err}");
    let managed = format!("{SERVERLESS_EXAMPLE}\n[ha]\nmode = \"managed\"\nrepl_user = \"r\"\n");
    let err = Config::parse(&managed, "t").unwrap_err().to_string();
    assert!(err.contains("managed"), "{err}");
    let bad = SERVERLESS_EXAMPLE.replace("min_ccu = 0.5", "min_ccu = 8.0");
    let err = Config::parse(&bad, "t").unwrap_err();
    assert!(
        matches!(&err, ConfigError::Parse { at, .. } if at.key.as_deref() == Some("serverless.scale")),
        "{err}"
    );
}

#[test]
fn ha_section_is_validated() {
    let base = "[[backend]]\nname=\"a\"\naddress=\"127.0.0.1:1\"\n";
    let cfg = Config::parse(&format!("{base}[ha]\nmode = \"managed\"\n"), "t").unwrap();
    assert_eq!(cfg.ha.mode, HaMode::Managed);
    let err = Config::parse(&format!("{base}[ha]\nfailure_threshold = 0\n"), "t").unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid config t, line 5, key ha.failure_threshold: must be at least 1"
    );
    assert!(Config::parse(&format!("{base}[ha]\nmode = \"auto\"\n"), "t").is_err());
    assert!(Config::parse(&format!("{base}[ha]\nbogus = 1\n"), "t").is_err());
}

#[test]
fn ha_defaults_and_redaction() {
    let c: HaConfig = toml::from_str("repl_password = \"s3cret\"\nmode = \"managed\"").unwrap();
    assert_eq!(c.mode, HaMode::Managed);
    assert_eq!(c.repl_user, "repl");
    assert!(c.failover_after() <= Duration::from_secs(2));
    assert!(c.validate().is_ok());
    assert!(!format!("{c:?}").contains("s3cret"));
    assert!(toml::from_str::<HaConfig>("bogus = 1").is_err());
}

#[test]
fn driver_kinds_are_an_enum() {
    let base = "[[backend]]\nname=\"a\"\naddress=\"127.0.0.1:1\"\n";
    let lab = Config::parse(
        &format!("{base}[driver]\nkind = \"lab\"\nlab_dir = \"/x\"\n"),
        "t",
    )
    .unwrap();
    assert_eq!(lab.driver.kind, DriverKind::Lab);
    assert_eq!(lab.driver.lab_dir, Some(PathBuf::from("/x")));
    // What older configs wrote for "no driver".
    let empty = Config::parse(&format!("{base}[driver]\nkind = \"\"\n"), "t").unwrap();
    assert_eq!(empty.driver.kind, DriverKind::None);
    assert!(Config::parse(&format!("{base}[driver]\nkind = \"k8s\"\n"), "t").is_err());
    let err = Config::parse(&format!("{base}[driver]\nkind = \"lab\"\n"), "t").unwrap_err();
    assert!(err.to_string().contains("lab_dir"), "{err}");

    let exec: InstanceDriverConfig =
        toml::from_str("kind = \"exec\"\nstart = \"a\"\nstop = \"b\"\n").unwrap();
    match exec {
        InstanceDriverConfig::Exec(e) => assert_eq!(e.timeout_ms, 60_000),
        other => panic!("{other:?}"),
    }
    assert!(toml::from_str::<InstanceDriverConfig>("kind = \"docker\"\n").is_err());
}

#[test]
fn unknown_keys_and_missing_backends_are_refused() {
    assert!(Config::parse(
        "[proxy]\nlisen = \"x\"\n[[backend]]\nname=\"a\"\naddress=\"b\"",
        "t"
    )
    .is_err());
    assert!(Config::parse("", "t").is_err());
}

#[test]
fn debug_redacts_monitor_password() {
    let a = AuthConfig {
        monitor_password: "hunter2".into(),
        ..Default::default()
    };
    assert!(!format!("{a:?}").contains("hunter2"));
}

#[test]
fn scale_policy_default_is_valid_and_matches_documented_values() {
    let p = ScalePolicy::default();
    assert!(p.validate().is_ok());
    assert_eq!((p.min_ccu, p.max_ccu, p.step_ccu), (0.5, 4.0, 0.5));
    assert_eq!((p.up_utilization, p.up_samples), (0.8, 2));
    assert_eq!(p.target_utilization, 0.6);
    assert_eq!((p.down_utilization, p.down_after_secs), (0.3, 60));
}

#[test]
fn scale_policy_validate_rejects_inconsistent_policies() {
    let with_step = |min: f64, max: f64, step: f64| ScalePolicy {
        min_ccu: min,
        max_ccu: max,
        step_ccu: step,
        ..ScalePolicy::default()
    };
    let bad: Vec<(&str, ScalePolicy)> = vec![
        ("min_ccu", with_step(0.0, 4.0, 0.5)),
        ("min_ccu", with_step(-1.0, 4.0, 0.5)),
        ("must not exceed max_ccu", with_step(5.0, 4.0, 0.5)),
        ("step_ccu", with_step(0.5, 4.0, 0.0)),
        ("finite", with_step(0.5, f64::INFINITY, 0.5)),
        ("finite", with_step(f64::NAN, 4.0, 0.5)),
        (
            "up_utilization",
            ScalePolicy {
                up_utilization: 1.5,
                ..ScalePolicy::default()
            },
        ),
        (
            "down_utilization",
            ScalePolicy {
                down_utilization: 0.0,
                ..ScalePolicy::default()
            },
        ),
        (
            "must be below up_utilization",
            ScalePolicy {
                down_utilization: 0.8,
                ..ScalePolicy::default()
            },
        ),
        (
            "must not exceed up_utilization",
            ScalePolicy {
                target_utilization: 0.9,
                ..ScalePolicy::default()
            },
        ),
        (
            "up_samples",
            ScalePolicy {
                up_samples: 0,
                ..ScalePolicy::default()
            },
        ),
    ];
    for (needle, policy) in bad {
        match policy.validate() {
            Err(ConfigError::InvalidKey { key, message }) => assert!(
                message.contains(needle) && key == "serverless.scale",
                "{policy:?}: {message:?} should mention {needle:?}"
            ),
            other => panic!("{policy:?} should be rejected ({needle}): {other:?}"),
        }
    }
    // Boundaries that are allowed: min == max, thresholds of exactly 1, target == up.
    let edge = ScalePolicy {
        min_ccu: 2.0,
        max_ccu: 2.0,
        up_utilization: 1.0,
        target_utilization: 1.0,
        ..ScalePolicy::default()
    };
    assert!(edge.validate().is_ok());
}

/// A config with every section and every optional key set, from defaults.
fn full_config() -> Config {
    let driver = ProcessDriverConfig::new(vec!["mariadbd".into()], "/p".into());
    let mut serverless = ServerlessConfig::new(InstanceDriverConfig::Process(driver));
    // The constructors give what a config that leaves the keys out gets.
    let parsed: ServerlessConfig = toml::from_str(
        "driver = { kind = \"process\", command = [\"mariadbd\"], pid_file = \"/p\" }",
    )
    .unwrap();
    assert_eq!(parsed, serverless);
    serverless.start_ccu = Some(1.0);
    if let InstanceDriverConfig::Process(p) = &mut serverless.driver {
        p.datadir = Some("/d".into());
        p.log = Some("/l".into());
        p.cgroup = Some("auto".into());
    }
    Config {
        tls: crate::TlsConfig {
            cert: Some("holdfast.pem".into()),
            key: Some("holdfast-key.pem".into()),
            require_tls: true,
            min_version: crate::TlsVersion::V1_3,
            reload_check_secs: 5,
        },
        backend_tls: crate::BackendTlsConfig {
            mode: crate::BackendTlsMode::VerifyCa,
            ca: Some("ca.pem".into()),
            cert: Some("client.pem".into()),
            key: Some("client-key.pem".into()),
        },
        backends: vec![BackendConfig {
            name: "node1".into(),
            address: "127.0.0.1:3306".into(),
            proxy_protocol: true,
        }],
        admin: AdminConfig {
            token_file: Some("admin.token".into()),
            allowed_hosts: vec!["admin.example".into()],
            ..AdminConfig::default()
        },
        driver: DriverConfig {
            kind: DriverKind::Lab,
            lab_dir: Some("/lab".into()),
            binaries: vec!["/usr/sbin/mariadbd".into()],
            ..DriverConfig::default()
        },
        listeners: vec![ListenerConfig {
            listen: "127.0.0.1:6035".into(),
            mode: ListenerMode::Passthrough,
            routing: Default::default(),
            trusted_proxies: Some(vec!["10.0.0.0/8".parse().unwrap()]),
        }],
        serverless: Some(serverless),
        log: crate::LogConfig {
            level: "warn,holdfast_proxy=debug".into(),
        },
        ..Config::default()
    }
}

/// Every key path (`a.b.c`; array elements share their array's path) in a TOML document.
fn key_paths(value: &toml::Value) -> BTreeSet<String> {
    fn walk(prefix: &str, value: &toml::Value, out: &mut BTreeSet<String>) {
        match value {
            toml::Value::Table(t) => {
                for (k, v) in t {
                    let path = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(path.clone());
                    walk(&path, v, out);
                }
            }
            toml::Value::Array(a) => a.iter().for_each(|v| walk(prefix, v, out)),
            _ => {}
        }
    }
    let mut out = BTreeSet::new();
    walk("", value, &mut out);
    out
}

#[test]
fn default_config_round_trips_with_every_key() {
    let cfg = full_config();
    cfg.validate().unwrap();
    let text = cfg.to_toml().unwrap();
    let back = Config::parse(&text, "serialised").unwrap();
    assert_eq!(back, cfg, "{text}");
    // Every key either example documents is written (none is lost or renamed on the way),
    // and with every option set the default config writes each key the types know.
    let written = key_paths(&toml::from_str(&text).unwrap());
    for example in [EXAMPLE, SERVERLESS_EXAMPLE] {
        let documented = key_paths(&toml::from_str(example).unwrap());
        // Passwords are never written back: a written config names password files.
        let secrets = ["auth.monitor_password", "ha.repl_password"];
        let missing: Vec<_> = documented
            .difference(&written)
            .filter(|k| !secrets.contains(&k.as_str()))
            .collect();
        assert!(missing.is_empty(), "not serialised: {missing:?}\n{text}");
    }
    for key in [
        "proxy.switchover_drain_ms",
        "auth.verifier_miss_refresh_ms",
        "ha.failover_cooloff_ms",
        "driver.lab_dir",
        "driver.binaries",
        "driver.allowed_options",
        "admin.token_file",
        "admin.allowed_hosts",
        "listener.mode",
        "serverless.start_ccu",
        "serverless.scale.down_after_secs",
        "serverless.driver.kind",
        "serverless.driver.cgroup",
        "tls.cert",
        "tls.key",
        "backend_tls.ca",
        "backend_tls.cert",
        "backend_tls.key",
    ] {
        assert!(written.contains(key), "{key} not written:\n{text}");
    }
}

#[test]
fn unset_options_are_left_out() {
    let mut cfg = full_config();
    cfg.driver = DriverConfig::default();
    cfg.admin = AdminConfig::default();
    cfg.listeners.clear();
    cfg.serverless = None;
    cfg.tls = Default::default();
    cfg.backend_tls = Default::default();
    let text = cfg.to_toml().unwrap();
    assert!(!text.contains("tls"), "{text}");
    assert!(!text.contains("lab_dir"), "{text}");
    assert!(!text.contains("token"), "{text}");
    assert!(!text.contains("listener"), "{text}");
    assert!(!text.contains("serverless"), "{text}");
    assert_eq!(Config::parse(&text, "t").unwrap(), cfg);

    let exec = InstanceDriverConfig::Exec(ExecDriverConfig {
        timeout_ms: 1,
        ..ExecDriverConfig::new("a", "b")
    });
    let text = toml::to_string(&exec).unwrap();
    assert_eq!(
        text,
        "kind = \"exec\"\nstart = \"a\"\nstop = \"b\"\ntimeout_ms = 1\n"
    );
    let process = ProcessDriverConfig {
        command: vec!["x".into()],
        pid_file: "/p".into(),
        datadir: None,
        log: None,
        start_timeout_ms: 1,
        stop_timeout_ms: 2,
        cgroup: None,
    };
    let back: InstanceDriverConfig =
        toml::from_str(&toml::to_string(&InstanceDriverConfig::Process(process.clone())).unwrap())
            .unwrap();
    assert_eq!(back, InstanceDriverConfig::Process(process));
}

const BASE: &str = "[[backend]]\nname=\"a\"\naddress=\"127.0.0.1:1\"\n";

#[test]
fn admin_listener_off_loopback_needs_an_explicit_token() {
    for listen in [
        "127.0.0.1:6034",
        "127.0.0.2:1",
        "[::1]:6034",
        "localhost:6034",
    ] {
        let text = format!("{BASE}[admin]\nlisten = \"{listen}\"\n");
        let cfg = Config::parse(&text, "t").unwrap_or_else(|e| panic!("{listen}: {e}"));
        assert!(cfg.admin.listens_on_loopback(), "{listen}");
    }
    for listen in [
        "0.0.0.0:6034",
        "[::]:6034",
        "10.1.2.3:6034",
        "admin.example:6034",
    ] {
        let text = format!("{BASE}[admin]\nlisten = \"{listen}\"\n");
        let err = Config::parse(&text, "t").unwrap_err().to_string();
        assert!(
            err.contains("not a loopback address") && err.contains("token_file"),
            "{listen}: {err}"
        );
        let with_file = format!("{text}token_file = \"/etc/holdfast/token\"\n");
        assert!(Config::parse(&with_file, "t").is_ok(), "{listen}");
        let inline = format!("{text}token = \"0123456789abcdef0123\"\n");
        assert!(Config::parse(&inline, "t").is_ok(), "{listen}");
    }
    let both = format!("{BASE}[admin]\ntoken = \"0123456789abcdef\"\ntoken_file = \"/t\"\n");
    assert!(Config::parse(&both, "t")
        .unwrap_err()
        .to_string()
        .contains("both"));
    let short = format!("{BASE}[admin]\ntoken = \"short\"\n");
    assert!(Config::parse(&short, "t")
        .unwrap_err()
        .to_string()
        .contains("too short"));
    let spaces = format!("{BASE}[admin]\ntoken = \"0123456789 abcdef\"\n");
    assert!(Config::parse(&spaces, "t").is_err());
    let port = format!("{BASE}[admin]\nallowed_hosts = [\"h:1\"]\n");
    assert!(Config::parse(&port, "t").is_err());
}

#[test]
fn admin_token_is_redacted_and_compared_whole() {
    let text = format!("{BASE}[admin]\ntoken = \"s3cret-s3cret-s3cret\"\n");
    let cfg = Config::parse(&text, "t").unwrap();
    let token = cfg.admin.token.clone().unwrap();
    assert!(!format!("{cfg:?}").contains("s3cret"));
    assert_eq!(format!("{token:?}"), "AdminToken(<redacted>)");
    assert!(token.matches(b"s3cret-s3cret-s3cret"));
    assert!(!token.matches(b"s3cret-s3cret-s3creT"));
    assert!(!token.matches(b"s3cret-s3cret-s3cret "));
    assert!(!token.matches(b""));
    // It round-trips (bench config variants rewrite a config with its token).
    assert_eq!(Config::parse(&cfg.to_toml().unwrap(), "t").unwrap(), cfg);
    let a = AdminToken::generate();
    let b = AdminToken::generate();
    assert_eq!(a.expose().len(), 64);
    assert!(a.expose().bytes().all(|c| c.is_ascii_hexdigit()));
    assert_ne!(a, b);
}

fn scratch_dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "holdfast-config-{name}-{}-{:08x}",
        std::process::id(),
        rand::random::<u32>()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

#[test]
fn token_file_is_generated_once_with_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = scratch_dir("gen");
    let config_path = dir.join("holdfast.toml");
    let admin = AdminConfig::default();
    // A client finds nothing before the first start.
    let err = admin.read_token(&config_path).unwrap_err().to_string();
    assert!(err.contains("holdfast.admin-token"), "{err}");
    let (token, source) = admin.load_or_generate_token(&config_path).unwrap();
    let path = dir.join("holdfast.admin-token");
    assert_eq!(source, TokenSource::Generated(path.clone()));
    let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    assert_eq!(admin::loose_permissions(&path), None);
    assert_eq!(
        std::fs::read_to_string(&path).unwrap(),
        format!("{}\n", token.expose())
    );
    // The next start and a client read the same token.
    let (again, source) = admin.load_or_generate_token(&config_path).unwrap();
    assert_eq!(source, TokenSource::File(path.clone()));
    assert_eq!(again, token);
    assert_eq!(admin.read_token(&config_path).unwrap(), token);

    // token_file, relative to the config's directory, is read and never created.
    let named = AdminConfig {
        token_file: Some("mine.token".into()),
        ..AdminConfig::default()
    };
    assert!(named.load_or_generate_token(&config_path).is_err());
    assert!(!dir.join("mine.token").exists());
    std::fs::write(dir.join("mine.token"), "  abcdefghijklmnopqrstuvwxyz\n").unwrap();
    std::fs::set_permissions(
        dir.join("mine.token"),
        std::fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let (t, source) = named.load_or_generate_token(&config_path).unwrap();
    assert_eq!(t.expose(), "abcdefghijklmnopqrstuvwxyz");
    assert_eq!(source, TokenSource::File(dir.join("mine.token")));
    assert_eq!(
        admin::loose_permissions(&dir.join("mine.token")),
        Some(0o644)
    );
    std::fs::write(dir.join("mine.token"), "short\n").unwrap();
    let err = named.read_token(&config_path).unwrap_err().to_string();
    assert!(err.contains("too short"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn driver_allow_lists() {
    let d = DriverConfig::default();
    assert!(d.binaries.is_empty());
    for ok in [
        "innodb_buffer_pool_size",
        "innodb-buffer-pool-size",
        "--max_connections",
        "MAX_CONNECTIONS",
    ] {
        assert!(d.option_allowed(ok), "{ok}");
    }
    for refused in [
        "general_log_file",
        "plugin_dir",
        "",
        "--",
        "max_connections_x",
    ] {
        assert!(!d.option_allowed(refused), "{refused}");
    }
    let relative = format!("{BASE}[driver]\nbinaries = [\"mariadbd\"]\n");
    assert!(Config::parse(&relative, "t")
        .unwrap_err()
        .to_string()
        .contains("absolute"));
    let odd = format!("{BASE}[driver]\nallowed_options = [\"a=b\"]\n");
    assert!(Config::parse(&odd, "t").is_err());
    let custom = format!(
        "{BASE}[driver]\nbinaries = [\"/opt/mariadb/bin/mariadbd\"]\nallowed_options = [\"table-open-cache\"]\n"
    );
    let cfg = Config::parse(&custom, "t").unwrap();
    assert!(cfg.driver.option_allowed("table_open_cache"));
    assert!(!cfg.driver.option_allowed("max_connections"));
}

#[test]
fn host_parts() {
    assert_eq!(admin::host_of("127.0.0.1:6034"), "127.0.0.1");
    assert_eq!(admin::host_of("[::1]:6034"), "::1");
    assert_eq!(admin::host_of("localhost:1"), "localhost");
    assert_eq!(admin::host_of("admin.example"), "admin.example");
    assert_eq!(admin::host_of("::1"), "::1");
}

#[test]
fn tls_sections_are_checked() {
    let parse = |t: &str| {
        Config::parse(
            &format!("[[backend]]\nname = \"n\"\naddress = \"a:1\"\n{t}"),
            "t",
        )
    };
    assert!(
        parse("[tls]\ncert = \"c.pem\"").is_err(),
        "cert without key"
    );
    assert!(
        parse("[tls]\nrequire_tls = true").is_err(),
        "require_tls without a certificate"
    );
    assert!(
        parse("[backend_tls]\nmode = \"verify-full\"").is_err(),
        "verify-full without ca"
    );
    assert!(
        parse("[backend_tls]\nmode = \"verify-ca\"\nca = \"ca.pem\"\ncert = \"c.pem\"").is_err()
    );
    let ok = parse("[tls]\ncert = \"c\"\nkey = \"k\"\nmin_version = \"1.3\"\n[backend_tls]\nmode = \"verify-ca\"\nca = \"ca.pem\"").unwrap();
    assert_eq!(ok.tls.min_version, crate::TlsVersion::V1_3);
    assert_eq!(ok.backend_tls.mode, crate::BackendTlsMode::VerifyCa);
}

/// Issue 20: a refused file names the file, the line and the key (at start and at a reload).
#[test]
fn errors_name_the_file_line_and_key() {
    let base = "[[backend]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n";
    let cases = [
        (
            format!("{base}[proxy]\nmax_connections = \"many\"\n"),
            "invalid config f.toml, line 5, column 19, key proxy.max_connections: invalid type: string \"many\", expected usize",
        ),
        (
            format!("[proxy]\nhold_window = 5\n{base}"),
            "invalid config f.toml, line 2, column 1, key proxy.hold_window: unknown field `hold_window`",
        ),
        (
            format!("{base}[proxy\n"),
            "invalid config f.toml, line 4, column 7",
        ),
        (
            format!("{base}\n[split]\ncausal_wait_ms = 0\n"),
            "invalid config f.toml, line 6, key split.causal_wait_ms: must be above 0",
        ),
        (
            format!("{base}[log]\nlevel = \"loud\"\n"),
            "invalid config f.toml, line 5, key log.level: \"loud\" is neither a level",
        ),
    ];
    for (text, want) in cases {
        let err = Config::parse(&text, "f.toml").unwrap_err().to_string();
        assert!(err.starts_with(want), "{err}\nwanted: {want}");
        assert!(!err.contains('\n'), "one line: {err}");
    }
}

#[test]
fn a_cluster_section_names_its_fleet_and_etcd() {
    let with = |section: &str| Config::parse(&format!("{EXAMPLE}\n[cluster]\n{section}"), "t");
    let cfg = with("name = \"prod\"\netcd = [\"http://127.0.0.1:2379\"]\n").unwrap();
    let c = cfg.cluster.expect("[cluster]");
    assert_eq!((c.name.as_str(), c.lease_ttl_secs), ("prod", 3));
    assert_eq!(c.member, None);
    // Each refusal names its key.
    for (section, key) in [
        (
            "name = \"a/b\"\netcd = [\"http://127.0.0.1:2379\"]\n",
            "cluster.name",
        ),
        ("name = \"prod\"\netcd = []\n", "cluster.etcd"),
        (
            "name = \"prod\"\netcd = [\"127.0.0.1:2379\"]\n",
            "cluster.etcd[0]",
        ),
        (
            "name = \"prod\"\netcd = [\"http://127.0.0.1:2379\"]\nlease_ttl_secs = 1\n",
            "cluster.lease_ttl_secs",
        ),
    ] {
        let e = with(section).expect_err(section).to_string();
        assert!(e.contains(key), "{section}: {e}");
    }
}
