//! The compressed protocol (`mariadb --compress`): offered by holdfast, used on the
//! session's backend connection too, and invisible in the results.

use holdfast_it::{Harness, Options};

#[test]
fn compressed_sessions_match_the_server_and_the_server_sees_compression() {
    let h = Harness::start_with(Options::default().server_args(&["--local-infile=1"]));
    let sql = "SHOW SESSION STATUS LIKE 'Compression'; \
               SELECT seq, REPEAT(CHAR(65 + seq % 26), 300) FROM seq_1_to_20000; \
               SELECT 1/0; SHOW WARNINGS; SELECT LENGTH(REPEAT('x', 3000000))";
    let args = ["--compress", "--batch", "sbtest", "-e", sql];
    let via = h.mariadb(h.proxy, &args);
    let direct = h.mariadb(h.direct(), &args);
    assert_eq!(via.code, Some(0), "{}", via.stderr);
    assert!(
        via.stdout
            .starts_with("Variable_name\tValue\nCompression\tON\n"),
        "{}",
        &via.stdout[..via.stdout.len().min(200)]
    );
    assert!(via.stdout.len() > 6_000_000, "{}", via.stdout.len());
    assert!(via.stdout == direct.stdout, "the results differ");

    // Compressed and encrypted, and a LOAD DATA LOCAL file through both layers.
    let ca = h
        .lab
        .status
        .ca
        .clone()
        .expect("lab CA")
        .display()
        .to_string();
    let dir = std::env::temp_dir().join(format!("holdfast-it-compress-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let file = dir.join("rows.tsv");
    let rows: String = (0..50_000).map(|i| format!("{i}\trow {i}\n")).collect();
    std::fs::write(&file, rows).expect("file");
    let load = format!(
        "CREATE TABLE z (id INT, v VARCHAR(40)); \
         LOAD DATA LOCAL INFILE '{}' INTO TABLE z; \
         SELECT COUNT(*), SUM(id) FROM z; SHOW SESSION STATUS LIKE 'Compression'",
        file.display()
    );
    let both = h.mariadb(
        h.proxy,
        &[
            "--compress",
            "--ssl",
            "--ssl-ca",
            &ca,
            "--ssl-verify-server-cert",
            "--local-infile=1",
            "--batch",
            "sbtest",
            "-e",
            &load,
        ],
    );
    assert_eq!(both.code, Some(0), "{both:?}");
    assert!(both.stdout.contains("50000\t1249975000"), "{both:?}");
    assert!(both.stdout.contains("Compression\tON"), "{both:?}");
}

/// A compressed session (the Rust `mysql` crate with compression) keeps its state across a
/// switchover; its connection to the new primary is compressed too.
#[test]
fn a_compressed_session_survives_a_switchover() {
    use mysql::prelude::Queryable;
    let h = Harness::start_with(Options::default().replicas(1));
    let opts = mysql::Opts::from_url(&h.url()).expect("url");
    let opts = mysql::OptsBuilder::from_opts(opts).compress(Some(mysql::Compression::default()));
    let mut c = mysql::Conn::new(opts).expect("compressed login");
    c.query_drop("SET @kept = 'across'").expect("set");
    // Thread ids of two servers may coincide: which server answers is what tells.
    let before: Option<u64> = c.query_first("SELECT @@server_id").expect("id");
    h.switch_over_to("node2");
    let kept: Option<String> = c.query_first("SELECT @kept").expect("after the switchover");
    assert_eq!(kept.as_deref(), Some("across"));
    let after: Option<u64> = c.query_first("SELECT @@server_id").expect("id");
    assert_ne!(before, after, "the session moved to the other node");
    let status: Option<(String, String)> = c
        .query_first("SHOW SESSION STATUS LIKE 'Compression'")
        .expect("status");
    assert_eq!(status.map(|s| s.1).as_deref(), Some("ON"));
    let big: Option<u64> = c
        .query_first("SELECT SUM(LENGTH(REPEAT('z', seq))) FROM seq_1_to_3000")
        .expect("a larger result");
    assert_eq!(big, Some(4_501_500));
}
