//! What a reload of the configuration file changes: every setting is either applied at
//! once (the next request, login or connection sees it) or needs holdfast to restart
//! (what is set up once: listeners' addresses, the admin API, the runtime, the drivers, the
//! HA mode). [`plan`] makes the configuration to run from the one running and the file's:
//! the file's, with each setting of the second kind kept as it runs; and says which keys
//! change now and which wait.
//!
//! The `[[backend]]` list is not part of it: nodes are added and removed through the
//! cluster's membership (with its checks), which reports on them itself.

use crate::{Config, ListenerConfig};
use serde::{Deserialize, Serialize};
use std::fmt;

/// What a reload tells about the settings that need a restart (the upgrade path of issue
/// 20 part 1, which will take them without closing sessions, does not exist yet).
pub const RESTART_NOTE: &str =
    "these apply when holdfast restarts; until then the running values stay in force";

/// One key whose value changes (or would).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Change {
    /// As in the file: `proxy.max_connections`, `serverless.scale.min_ccu`; a
    /// `[[listener]]` by its address: `listener."127.0.0.1:6035".routing`.
    pub key: String,
    /// The value before, as TOML; none when it was not set, or for a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<String>,
    /// The new value, as TOML; none when it is not set, or for a secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub to: Option<String>,
}

impl fmt::Display for Change {
    /// `proxy.max_connections: 10000 -> 5`; `auth.monitor_password: changed`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unset = "(unset)";
        match (&self.from, &self.to) {
            (None, None) => write!(f, "{}: changed", self.key),
            (from, to) => write!(
                f,
                "{}: {} -> {}",
                self.key,
                from.as_deref().unwrap_or(unset),
                to.as_deref().unwrap_or(unset)
            ),
        }
    }
}

/// The outcome of [`plan`].
#[derive(Debug, Clone)]
pub struct Plan {
    /// What to run: the file's configuration with each setting that needs a restart kept
    /// as it runs.
    pub effective: Config,
    /// Keys whose new value applies now.
    pub applied: Vec<Change>,
    /// Keys whose new value waits for a restart of holdfast.
    pub needs_restart: Vec<Change>,
}

/// Keys whose values are never shown (their changes are).
const SECRETS: &[&str] = &["admin.token", "auth.monitor_password", "ha.repl_password"];

/// The configuration to run after reading `file` while `running` is in force, and what
/// changes. Neither is validated here: `file` was by [`Config::load`], and the caller
/// validates [`Plan::effective`] (the kept settings may not go with the file's others).
pub fn plan(running: &Config, file: &Config) -> Plan {
    let effective = keep_restart_settings(running, file);
    Plan {
        applied: changes(running, &effective),
        needs_restart: changes(&effective, file),
        effective,
    }
}

/// `file` with what only a restart can change taken from `running`.
fn keep_restart_settings(running: &Config, file: &Config) -> Config {
    let mut eff = file.clone();
    // Bound, started or built once at start.
    eff.proxy.listen = running.proxy.listen.clone();
    eff.proxy.worker_threads = running.proxy.worker_threads;
    eff.proxy.backend_source_address = running.proxy.backend_source_address;
    eff.proxy.backend_tcp_user_timeout_ms = running.proxy.backend_tcp_user_timeout_ms;
    eff.admin = running.admin.clone();
    // The fleet's membership is started at start.
    eff.cluster = running.cluster.clone();
    eff.driver.kind = running.driver.kind;
    eff.driver.lab_dir = running.driver.lab_dir.clone();
    // The failure detector, the semi-sync keeper and the marker table are started (or
    // not) at start.
    eff.ha.mode = running.ha.mode;
    eff.ha.durability = running.ha.durability;
    eff.ha.commit_markers = running.ha.commit_markers;
    // The instance's driver, ledger and meter are made at start; the knobs of its
    // lifecycle and scaling apply at once.
    eff.serverless = match (&running.serverless, &file.serverless) {
        (Some(run), Some(new)) => {
            let mut s = new.clone();
            s.instance = run.instance.clone();
            s.start_ccu = run.start_ccu;
            s.ledger = run.ledger.clone();
            s.period_secs = run.period_secs;
            s.flush_secs = run.flush_secs;
            s.driver = run.driver.clone();
            Some(s)
        }
        (run, _) => run.clone(),
    };
    // A new certificate (or its key, or the oldest version) is loaded at once; offering
    // TLS or not is decided at start.
    if running.tls.enabled() != file.tls.enabled() {
        eff.tls = running.tls.clone();
    }
    // The listeners bound now, each with the file's settings when the file still has its
    // address; new addresses wait.
    eff.listeners = running
        .listeners
        .iter()
        .map(|run| {
            file.listeners
                .iter()
                .find(|l| l.listen == run.listen)
                .unwrap_or(run)
                .clone()
        })
        .collect();
    eff
}

/// The keys whose values differ between `a` and `b` (not the `[[backend]]` list).
fn changes(a: &Config, b: &Config) -> Vec<Change> {
    let mut out = Vec::new();
    diff("", tree(a).as_ref(), tree(b).as_ref(), &mut out);
    // Never serialised, compared as they are.
    for (key, changed) in [
        (
            "auth.monitor_password",
            a.auth.monitor_password != b.auth.monitor_password,
        ),
        ("ha.repl_password", a.ha.repl_password != b.ha.repl_password),
    ] {
        if changed {
            out.push(Change {
                key: key.into(),
                from: None,
                to: None,
            });
        }
    }
    out
}

/// The config as a TOML tree, `[[listener]]`s keyed by address, without `[[backend]]`.
fn tree(cfg: &Config) -> Option<toml::Value> {
    let mut value = toml::Value::try_from(cfg).ok()?;
    let table = value.as_table_mut()?;
    table.remove("backend");
    // Sections left out of the file when they hold their defaults: compared key by key.
    for (name, section) in [
        ("tls", toml::Value::try_from(&cfg.tls)),
        ("backend_tls", toml::Value::try_from(&cfg.backend_tls)),
        ("log", toml::Value::try_from(&cfg.log)),
    ] {
        if let Ok(section) = section {
            table.insert(name.into(), section);
        }
    }
    if let Some(toml::Value::Array(list)) = table.remove("listener") {
        let mut by_address = toml::map::Map::new();
        for l in list {
            let Ok(parsed) = l.clone().try_into::<ListenerConfig>() else {
                continue;
            };
            let mut l = l;
            if let Some(t) = l.as_table_mut() {
                t.remove("listen");
            }
            by_address.insert(format!("{:?}", parsed.listen), l);
        }
        table.insert("listener".into(), toml::Value::Table(by_address));
    }
    Some(value)
}

fn diff(path: &str, a: Option<&toml::Value>, b: Option<&toml::Value>, out: &mut Vec<Change>) {
    if let (Some(toml::Value::Table(ta)), Some(toml::Value::Table(tb))) = (a, b) {
        let mut keys: Vec<&String> = ta.keys().chain(tb.keys()).collect();
        keys.sort();
        keys.dedup();
        for k in keys {
            let sub = if path.is_empty() {
                k.clone()
            } else {
                format!("{path}.{k}")
            };
            diff(&sub, ta.get(k), tb.get(k), out);
        }
        return;
    }
    if a == b {
        return;
    }
    let secret = SECRETS.contains(&path);
    let show = |v: Option<&toml::Value>| v.filter(|_| !secret).map(inline);
    out.push(Change {
        key: path.to_string(),
        from: show(a),
        to: show(b),
    });
}

/// A value as one line of TOML.
fn inline(v: &toml::Value) -> String {
    match v {
        toml::Value::Table(t) => {
            let parts: Vec<String> = t
                .iter()
                .map(|(k, v)| format!("{k} = {}", inline(v)))
                .collect();
            format!("{{ {} }}", parts.join(", "))
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{ListenerMode, Routing};

    fn base() -> Config {
        Config::parse(
            "[[backend]]\nname = \"a\"\naddress = \"127.0.0.1:1\"\n\
             [[listener]]\nlisten = \"127.0.0.1:6035\"\n",
            "t",
        )
        .unwrap()
    }

    fn keys(list: &[Change]) -> Vec<&str> {
        list.iter().map(|c| c.key.as_str()).collect()
    }

    #[test]
    fn live_settings_apply_and_structural_ones_wait() {
        let running = base();
        let mut file = running.clone();
        file.proxy.max_connections = 5;
        file.proxy.hold_window_ms = 1_000;
        file.proxy.listen = "127.0.0.1:7033".into();
        file.ha.probe_interval_ms = 100;
        file.ha.mode = crate::HaMode::Managed;
        file.log.level = "warn".into();
        file.auth.monitor_password = "new".into();
        file.admin.listen = "127.0.0.1:7034".into();
        let p = plan(&running, &file);
        assert_eq!(
            keys(&p.applied),
            [
                "ha.probe_interval_ms",
                "log.level",
                "proxy.hold_window_ms",
                "proxy.max_connections",
                "auth.monitor_password"
            ]
        );
        assert_eq!(
            keys(&p.needs_restart),
            ["admin.listen", "ha.mode", "proxy.listen"]
        );
        assert_eq!(p.effective.proxy.listen, running.proxy.listen);
        assert_eq!(p.effective.ha.mode, running.ha.mode);
        assert_eq!(p.effective.proxy.max_connections, 5);
        assert_eq!(
            p.applied[3].to_string(),
            "proxy.max_connections: 10000 -> 5"
        );
        assert_eq!(p.applied[4].to_string(), "auth.monitor_password: changed");
        assert_eq!(
            p.needs_restart[2].to_string(),
            "proxy.listen: \"127.0.0.1:6033\" -> \"127.0.0.1:7033\""
        );
        // Nothing changed: nothing to say.
        let same = plan(&running, &running);
        assert!(same.applied.is_empty() && same.needs_restart.is_empty());
    }

    #[test]
    fn listeners_are_kept_by_address() {
        let running = base();
        let mut file = running.clone();
        file.listeners[0].routing = Routing::Split;
        file.listeners.push(ListenerConfig {
            listen: "127.0.0.1:6036".into(),
            mode: ListenerMode::Passthrough,
            routing: Routing::Primary,
            trusted_proxies: None,
        });
        let p = plan(&running, &file);
        assert_eq!(keys(&p.applied), ["listener.\"127.0.0.1:6035\".routing"]);
        assert_eq!(keys(&p.needs_restart), ["listener.\"127.0.0.1:6036\""]);
        assert_eq!(p.effective.listeners.len(), 1);
        assert_eq!(p.effective.listeners[0].routing, Routing::Split);
        // Moved to another address: the old one stays bound, with its settings.
        let mut moved = running.clone();
        moved.listeners[0].listen = "127.0.0.1:6037".into();
        moved.listeners[0].routing = Routing::Split;
        let p = plan(&running, &moved);
        assert!(p.applied.is_empty(), "{:?}", p.applied);
        assert_eq!(
            keys(&p.needs_restart),
            ["listener.\"127.0.0.1:6035\"", "listener.\"127.0.0.1:6037\""]
        );
        assert_eq!(p.effective.listeners, running.listeners);
    }

    #[test]
    fn tls_certificates_apply_but_turning_tls_on_waits() {
        let mut running = base();
        let mut file = running.clone();
        file.tls.cert = Some("c.pem".into());
        file.tls.key = Some("k.pem".into());
        let p = plan(&running, &file);
        assert!(p.applied.is_empty(), "{:?}", p.applied);
        assert_eq!(keys(&p.needs_restart), ["tls.cert", "tls.key"]);
        assert!(!p.effective.tls.enabled());
        running.tls = file.tls.clone();
        file.tls.cert = Some("renewed.pem".into());
        let p = plan(&running, &file);
        assert_eq!(keys(&p.applied), ["tls.cert"]);
        assert!(p.needs_restart.is_empty());
    }

    #[test]
    fn secrets_are_never_shown() {
        let running = base();
        let mut file = running.clone();
        file.admin.token = Some(crate::AdminToken::new("0123456789abcdef-secret"));
        file.ha.repl_password = "s3cret".into();
        let p = plan(&running, &file);
        let text = format!("{:?} {:?}", p.applied, p.needs_restart);
        assert!(
            !text.contains("secret") && !text.contains("s3cret"),
            "{text}"
        );
        assert_eq!(keys(&p.applied), ["ha.repl_password"]);
        assert_eq!(keys(&p.needs_restart), ["admin.token"]);
    }

    #[test]
    fn serverless_knobs_apply_but_its_driver_and_ledger_wait() {
        let text = include_str!("../../../holdfast.serverless.example.toml");
        let running = Config::parse(text, "t").unwrap();
        let mut file = running.clone();
        let sl = file.serverless.as_mut().unwrap();
        sl.idle_pause_secs = 5;
        sl.scale.max_ccu = 2.0;
        sl.ledger = "other.db".into();
        let p = plan(&running, &file);
        assert_eq!(
            keys(&p.applied),
            ["serverless.idle_pause_secs", "serverless.scale.max_ccu"]
        );
        assert_eq!(keys(&p.needs_restart), ["serverless.ledger"]);
        let mut gone = running.clone();
        gone.serverless = None;
        let p = plan(&running, &gone);
        assert_eq!(keys(&p.needs_restart), ["serverless"]);
        assert!(p.effective.serverless.is_some());
    }
}
