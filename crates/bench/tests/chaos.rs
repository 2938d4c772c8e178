//! The chaos drill, short enough for CI: 5 faults (two network cuts among them when
//! nftables can be used), 8 clients, on a fresh lab of real
//! mariadbd processes, through the `holdfast` binary built next to `holdfast-bench`
//! (`cargo build -p holdfast -p holdfast-bench`). It must pass: nothing lost, nothing
//! applied twice, no anomaly, no unexplained client error.

use std::path::PathBuf;
use std::process::Command;
use std::time::Instant;

fn nft_usable() -> bool {
    Command::new("nft")
        .args(["list", "tables"])
        .output()
        .is_ok_and(|o| o.status.success())
}

#[test]
fn a_short_chaos_run_passes() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_holdfast-bench"));
    let holdfast = bench.with_file_name("holdfast");
    assert!(
        holdfast.is_file(),
        "no holdfast binary at {}: cargo build -p holdfast first",
        holdfast.display()
    );
    let dir = std::env::temp_dir().join(format!("holdfast-chaos-test-{}", std::process::id()));
    let started = Instant::now();
    let out = Command::new(&bench)
        .args([
            "drill",
            "--scenario",
            "chaos",
            "--faults",
            "5",
            "--clients",
            "8",
        ])
        .args([
            "--seed",
            "7",
            "--duration-limit",
            "120",
            "--base-port",
            "3710",
        ])
        // One of each kind that matters most, a network cut among them when nftables can
        // be used here (root; scripts/deps.sh installs it).
        .args(match nft_usable() {
            true => [
                "--kinds",
                "cut-holdfast,kill,cut-replicas,switchover,restart",
            ],
            false => ["--kinds", "kill,switchover,slow,restart,remove-add"],
        })
        .arg("--dir")
        .arg(&dir)
        .arg("--holdfast")
        .arg(&holdfast)
        .output()
        .expect("running holdfast-bench");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    let verdict = text
        .lines()
        .find(|l| l.starts_with("chaos: ") && l.contains(" faults, "))
        .unwrap_or("no verdict line");
    // A failed run keeps its directory (the history, holdfast's log) to be read.
    if out.status.success() && verdict.ends_with(": PASS") {
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(
        out.status.success() && verdict.ends_with(": PASS"),
        "the chaos drill failed: {verdict}"
    );
    println!("the short chaos run took {:?}", started.elapsed());
}
