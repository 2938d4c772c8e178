//! The differential fuzzer, short enough for CI: the first 8 sessions of seed 5 (~20 s)
//! on a fresh lab (a primary and a replica) through the `holdfast` binary built next to
//! `holdfast-bench` (`cargo build -p holdfast -p holdfast-bench`), in the lab's own
//! configuration. Every session must look the same directly and through each listener.
//! A fixed set of sessions, so that the test says the same on the same code: longer runs
//! (`holdfast-bench fuzz --duration 3600`) still find open differences, listed in
//! docs/benchmarks.md (issue 18).

use std::path::PathBuf;
use std::process::Command;

#[test]
fn a_short_fuzz_run_finds_no_difference() {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_holdfast-bench"));
    let holdfast = bench.with_file_name("holdfast");
    assert!(
        holdfast.is_file(),
        "no holdfast binary at {}: cargo build -p holdfast first",
        holdfast.display()
    );
    let dir = std::env::temp_dir().join(format!("holdfast-fuzz-test-{}", std::process::id()));
    let out = Command::new(&bench)
        .args([
            "fuzz",
            "--seed",
            "5",
            "--sessions",
            "8",
            "--duration",
            "120",
        ])
        .args(["--shrink-secs", "60", "--base-port", "3760"])
        .arg("--dir")
        .arg(&dir)
        .arg("--holdfast")
        .arg(&holdfast)
        .output()
        .expect("running holdfast-bench");
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    println!("{text}");
    let _ = std::fs::remove_dir_all(&dir);
    let verdict = text
        .lines()
        .find(|l| l.starts_with("fuzz: seed ") && l.contains(" requests ("))
        .unwrap_or("no verdict line");
    assert!(
        out.status.success() && verdict.ends_with(": PASS"),
        "the fuzzer found differences: {verdict}"
    );
}
