//! The README walk (issue 19, "First hour"): the README's commands run the way a newcomer
//! runs them, in the README's order, with the `holdfast` binary cargo built and the
//! `mariadb` CLI, each followed by what the README says the user will see (its comments and
//! prose are asserted, not only the exit codes).
//!
//! The commands are read from README.md itself: its fenced `sh` and `sql` blocks, and the
//! few complete commands its prose gives in backquotes (`kill -CONT ...`, `DROP USER ...`,
//! `install -m 600 ...`, the TLS `mariadb` line). Each walk takes its section's commands
//! one by one ([`Walk::expect`] names the command it expects next), so a command added,
//! removed, reordered or reworded in a walked section fails the walk until the walk follows
//! it; `readme_walk_runs_or_names_every_command` fails on a shell command in any other
//! section unless [`NOT_RUN`] names it with the reason. Each line runs through `sh -c` in
//! the walk's working directory, with nothing of holdfast's in the environment.
//!
//! Substitutions, only what must differ on a machine shared by parallel tests and other
//! engineers (each is echoed in the walk's transcript, printed when a step fails):
//! - `holdfast` is the binary cargo built for this test: its directory comes first on
//!   PATH, in place of `~/.cargo/bin` after the README's `cargo install`.
//! - The README's directories (`/tmp/hf-lab`, `/tmp/hf-sl`) become directories of this
//!   run's own; the prose's placeholder `DIR` becomes the lab's directory.
//! - The README's ports (3310 and the lab's layout from it; 6033 and 6034 of
//!   `holdfast.example.toml`) become free ones the test picks: `holdfast lab up` gets
//!   `--base-port` (as the README says a second lab must), the example config's `listen`
//!   addresses are edited with the password and the backend the README says to set.
//! - `holdfast.example.toml` is the checkout's (the README runs in the checkout, the walk
//!   in a directory of its own).
//! - `mariadb ... -u app -p` asks for the password on a terminal; the walk has none, so
//!   the password is given with `-p` and the statement a person would type comes on stdin
//!   (so does the TLS line's).
//! - `holdfast serve` runs until stopped: it runs in the background (the README's other
//!   blocks say `&`), and the next command waits (with a deadline) until it answers, as a
//!   person typing the next line would. Likewise the keep-alive block's sleeping session:
//!   the switchover is typed once node1 runs its `DO SLEEP(2)`.
//! - `holdfast lab status --json` gets `--dir`.
//!
//! "Your own server" of "Pointing holdfast at an existing server" is a fresh
//! `mariadb-install-db` server the walk starts (its defaults: anonymous accounts, names
//! resolved), with an application account `app` of its own.
//!
//! Not run, with the reason: the quick start's `bash scripts/demo.sh` (minutes of sysbench
//! drills, far too long for CI) and `bash scripts/test.sh` (it is CI: it would run this
//! test again), and the install step's `cargo install` (it would write into this machine's
//! `~/.cargo/bin`; the walk checks the packages it names build those binaries and uses the
//! binary cargo built): see [`NOT_RUN`].

#[allow(dead_code)] // (the helpers other process tests use)
mod common;

use holdfast_lab::procs;
use std::io::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const README: &str = include_str!("../../../README.md");
const REPO: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../..");

/// How long one command may take (a cold start, a lab up on a busy machine).
const COMMAND_TIMEOUT: Duration = Duration::from_secs(90);
/// How long `holdfast serve` may take to answer after it starts.
const SERVE_READY: Duration = Duration::from_secs(60);

/// README commands the walks do not run, each with the reason. Every entry must still be in
/// the README, and every shell command outside the walked sections must be here.
const NOT_RUN: &[(&str, &str)] = &[
    (
        "bash scripts/demo.sh",
        "minutes of sysbench drills (keep-alive and serverless): far too long for CI; \
         `holdfast-bench`'s own tests run its parts",
    ),
    (
        "bash scripts/test.sh",
        "it is what CI runs: it would run this walk again; checked: the script exists",
    ),
    (
        "cargo install --locked --path crates/holdfast",
        "would write into this machine's ~/.cargo/bin; checked: the path is the package \
         that builds `holdfast`, and the walks run the binary cargo built",
    ),
    (
        "cargo install --locked --path crates/bench",
        "as above: checked that the path is the package that builds `holdfast-bench`",
    ),
    (
        "holdfast ctl -c /tmp/hf-lab/holdfast.toml dashboard",
        "its link is for a browser: tests/dashboard.rs runs `ctl dashboard` against a lab \
         and opens the link in headless Chromium",
    ),
];

/// The sections the walks below follow command by command.
const WALKED: &[&str] = &[
    "Keep-alive in two minutes (a lab cluster)",
    "A serverless instance in two minutes",
    "Pointing holdfast at an existing server",
];

// ---------------------------------------------------------------------------------------
// Reading the README.

/// One fenced block: its info string (`sh`, `sql`) and its lines, trimmed.
struct Block {
    lang: String,
    lines: Vec<String>,
}

/// A `## ` section: its title, its prose (outside fences) and its blocks.
struct Section {
    title: String,
    text: String,
    blocks: Vec<Block>,
}

/// A shell command of a block: the command and its `# comment`.
#[derive(Clone, Debug)]
struct Cmd {
    text: String,
    comment: String,
}

fn sections() -> Vec<Section> {
    let mut out: Vec<Section> = Vec::new();
    let mut fence: Option<Block> = None;
    for line in README.lines() {
        let trimmed = line.trim();
        if let Some(info) = trimmed.strip_prefix("```") {
            match fence.take() {
                Some(block) => {
                    if let Some(s) = out.last_mut() {
                        s.blocks.push(block);
                    }
                }
                None => {
                    fence = Some(Block {
                        lang: info.trim().to_string(),
                        lines: Vec::new(),
                    })
                }
            }
            continue;
        }
        if let Some(block) = fence.as_mut() {
            block.lines.push(trimmed.to_string());
            continue;
        }
        if let Some(title) = line.strip_prefix("## ") {
            out.push(Section {
                title: title.trim().to_string(),
                text: String::new(),
                blocks: Vec::new(),
            });
            continue;
        }
        if let Some(s) = out.last_mut() {
            s.text.push_str(line);
            s.text.push('\n');
        }
    }
    assert!(fence.is_none(), "README.md: a code fence is never closed");
    out
}

fn section(title: &str) -> Section {
    sections()
        .into_iter()
        .find(|s| s.title == title)
        .unwrap_or_else(|| {
            panic!("README.md has no section `## {title}` any more: the walk follows it, update the walk")
        })
}

/// A line without its `# comment` (a `#` after white space, outside quotes).
fn split_comment(line: &str) -> (String, String) {
    let mut quote: Option<char> = None;
    let mut after_space = true;
    for (i, c) in line.char_indices() {
        match quote {
            Some(q) if c == q => quote = None,
            Some(_) => {}
            None if c == '\'' || c == '"' => quote = Some(c),
            None if c == '#' && after_space => {
                return (
                    line[..i].trim().to_string(),
                    line[i + 1..].trim().to_string(),
                );
            }
            None => {}
        }
        after_space = c.is_whitespace();
    }
    (line.trim().to_string(), String::new())
}

impl Section {
    /// The commands of its `sh`/`bash` blocks, in order (comment-only lines left out).
    fn shell_commands(&self) -> Vec<Cmd> {
        self.blocks
            .iter()
            .filter(|b| b.lang == "sh" || b.lang == "bash")
            .flat_map(|b| b.lines.iter())
            .map(|l| split_comment(l))
            .filter(|(text, _)| !text.is_empty())
            .map(|(text, comment)| Cmd { text, comment })
            .collect()
    }

    /// Its `sql` blocks, as written.
    fn sql_blocks(&self) -> Vec<String> {
        self.blocks
            .iter()
            .filter(|b| b.lang == "sql")
            .map(|b| b.lines.join("\n"))
            .collect()
    }

    /// The backquoted span of its prose that starts with `start` (white space, line breaks
    /// included, collapsed to one space).
    fn inline_command(&self, start: &str) -> String {
        self.text
            .split('`')
            .skip(1)
            .step_by(2)
            .map(|span| span.split_whitespace().collect::<Vec<_>>().join(" "))
            .find(|span| span.starts_with(start))
            .unwrap_or_else(|| {
                panic!(
                    "the README's section `{}` no longer gives `{start}...` in its prose: update the walk",
                    self.title
                )
            })
    }
}

// ---------------------------------------------------------------------------------------
// Running commands as a person at a shell would.

/// What a command printed and how it ended.
#[derive(Debug)]
struct Out {
    line: String,
    status: ExitStatus,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl Out {
    fn ok(&self) -> &Self {
        assert!(
            self.status.success(),
            "`{}` failed ({}):\nstdout:\n{}\nstderr:\n{}",
            self.line,
            self.status,
            self.stdout,
            self.stderr
        );
        self
    }
}

fn holdfast_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_holdfast"))
}

/// PATH with the built `holdfast` first (the README's `cargo install` puts it on PATH).
fn path_env() -> String {
    let bin_dir = holdfast_bin()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    match std::env::var("PATH") {
        Ok(p) => format!("{}:{p}", bin_dir.display()),
        Err(_) => bin_dir.display().to_string(),
    }
}

/// A shell command line, run by `sh -c` in `cwd` (the environment a newcomer's shell has:
/// nothing of holdfast's set).
fn shell(cwd: &Path, line: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg(line)
        .current_dir(cwd)
        .env("PATH", path_env())
        .env_remove("HOLDFAST_ADMIN_TOKEN")
        .env_remove("HOLDFAST_ADMIN")
        .env_remove("RUST_LOG")
        .env("RUST_BACKTRACE", "0");
    cmd
}

/// A replacement in the README's commands (why it is needed goes to the transcript).
struct Sub {
    from: String,
    to: String,
}

/// One section's commands, taken in order and run.
struct Walk {
    section: String,
    commands: std::vec::IntoIter<Cmd>,
    cwd: PathBuf,
    subs: Vec<Sub>,
    /// Background commands (`... &`), as the shell numbers its jobs: %1 is `jobs[0]`.
    jobs: Vec<Child>,
    /// The jobs' standard error, shown when a walk fails.
    job_logs: Vec<PathBuf>,
    ran: usize,
    transcript: Vec<String>,
}

impl Walk {
    fn new(section: &Section, cwd: &Path) -> Walk {
        Walk {
            section: section.title.clone(),
            commands: section.shell_commands().into_iter(),
            cwd: cwd.to_path_buf(),
            subs: Vec::new(),
            jobs: Vec::new(),
            job_logs: Vec::new(),
            ran: 0,
            transcript: Vec::new(),
        }
    }

    fn sub(&mut self, from: impl Into<String>, to: impl Into<String>, why: &'static str) {
        let (from, to) = (from.into(), to.into());
        self.note(format!("substitution: `{from}` -> `{to}` ({why})"));
        self.subs.retain(|s| s.from != from);
        self.subs.push(Sub { from, to });
    }

    fn note(&mut self, line: String) {
        eprintln!("[readme walk] {line}");
        self.transcript.push(line);
    }

    /// The README's next command, which must start with `start`.
    fn expect(&mut self, start: &str) -> Cmd {
        match self.commands.next() {
            Some(cmd) if cmd.text.starts_with(start) => cmd,
            Some(cmd) => panic!(
                "the README's section `{}` changed: the walk expected a command starting with \
                 `{start}` and found `{}`; make the walk follow it",
                self.section, cmd.text
            ),
            None => panic!(
                "the README's section `{}` changed: the walk expected `{start}...`, the \
                 section has no more commands",
                self.section
            ),
        }
    }

    /// Every command of the section was taken.
    fn finish(&mut self) {
        let left: Vec<String> = self.commands.by_ref().map(|c| c.text).collect();
        assert!(
            left.is_empty(),
            "the README's section `{}` has commands the walk does not run: {left:?}",
            self.section
        );
    }

    /// The line as it runs here: every substitution applied.
    fn adapt(&self, line: &str) -> String {
        let mut line = line.to_string();
        for s in &self.subs {
            line = line.replace(&s.from, &s.to);
        }
        line
    }

    /// Runs a README line (substituted) in the foreground.
    fn run(&mut self, line: &str) -> Out {
        let adapted = self.adapt(line);
        self.run_as_is(&adapted, None)
    }

    /// Runs a line exactly as given, `stdin` fed to it (closed after), within
    /// [`COMMAND_TIMEOUT`].
    fn run_as_is(&mut self, line: &str, stdin: Option<&str>) -> Out {
        self.ran += 1;
        let n = self.ran;
        let out_path = self.cwd.join(format!(".walk-{n}.out"));
        let err_path = self.cwd.join(format!(".walk-{n}.err"));
        let started = Instant::now();
        let mut child = shell(&self.cwd, line)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(std::fs::File::create(&out_path).expect("an output file"))
            .stderr(std::fs::File::create(&err_path).expect("an output file"))
            .spawn()
            .expect("running sh");
        if let (Some(input), Some(mut pipe)) = (stdin, child.stdin.take()) {
            pipe.write_all(input.as_bytes()).expect("writing stdin");
        }
        let status = loop {
            if let Some(status) = child.try_wait().expect("waiting for sh") {
                break status;
            }
            if started.elapsed() > COMMAND_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                panic!("`{line}` did not finish within {COMMAND_TIMEOUT:?}");
            }
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = started.elapsed();
        let out = Out {
            line: line.to_string(),
            status,
            stdout: std::fs::read_to_string(&out_path).unwrap_or_default(),
            stderr: std::fs::read_to_string(&err_path).unwrap_or_default(),
            took,
        };
        self.note(format!(
            "$ {line}   [{}, {} ms]\n{}{}",
            status,
            took.as_millis(),
            shortened(&out.stdout),
            shortened(&out.stderr)
        ));
        out
    }

    /// Starts a README line ending in `&` (or a server the walk must leave running) in the
    /// background: a job, as the shell numbers them. Its standard error goes to `log`, its
    /// standard output beside it (`LOG.out`).
    fn background(&mut self, line: &str, log: &Path) -> usize {
        let adapted = self.adapt(line.trim_end_matches('&').trim());
        let child = shell(&self.cwd, &format!("exec {adapted}"))
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(log.with_extension("out")).expect("an output file"))
            .stderr(std::fs::File::create(log).expect("a log file"))
            .spawn()
            .expect("starting a background command");
        self.jobs.push(child);
        self.job_logs.push(log.to_path_buf());
        let job = self.jobs.len();
        self.note(format!(
            "$ {adapted} &   [job %{job}, pid {}]",
            self.jobs[job - 1].id()
        ));
        job
    }

    /// Waits (at most `timeout`) until the job exits by itself.
    fn wait_job(&mut self, job: usize, timeout: Duration) -> ExitStatus {
        let deadline = Instant::now() + timeout;
        let status = loop {
            if let Some(status) = self.jobs[job - 1].try_wait().expect("waiting for a job") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "job %{job} did not end within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.note(format!("job %{job} ended: {status}"));
        status
    }

    /// `kill -SIGNAL %job`: signals the job and waits (with a deadline) until it exits.
    fn signal_job(&mut self, job: usize, signal: &str) -> ExitStatus {
        let pid = self.jobs[job - 1].id();
        let sent = Command::new("kill")
            .args([&format!("-{signal}"), &pid.to_string()])
            .status()
            .expect("kill");
        assert!(sent.success(), "kill -{signal} {pid}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = self.jobs[job - 1].try_wait().expect("waiting for a job") {
                break status;
            }
            assert!(
                Instant::now() < deadline,
                "job %{job} (pid {pid}) did not exit within 30 s of SIG{signal}"
            );
            std::thread::sleep(Duration::from_millis(20));
        };
        self.note(format!("job %{job} SIG{signal}: {status}"));
        status
    }
}

impl Drop for Walk {
    fn drop(&mut self) {
        for job in &mut self.jobs {
            if job.try_wait().ok().flatten().is_none() {
                let _ = job.kill();
                let _ = job.wait();
            }
        }
        if std::thread::panicking() {
            eprintln!(
                "README walk of `{}`, transcript:\n{}",
                self.section,
                self.transcript.join("\n")
            );
            for (i, log) in self.job_logs.iter().enumerate() {
                eprintln!(
                    "job %{} stderr ({}), last lines:\n{}",
                    i + 1,
                    log.display(),
                    procs::tail_file(log, 80)
                );
            }
        }
    }
}

/// `holdfast ctl --config CONFIG status` (an observation of the walk, not a README line).
fn status_text(config: &Path) -> Option<String> {
    let out = procs::output_within(
        Command::new(holdfast_bin())
            .args(["ctl", "--config"])
            .arg(config)
            .arg("status")
            .env_remove("HOLDFAST_ADMIN_TOKEN")
            .env_remove("HOLDFAST_ADMIN"),
        Duration::from_secs(20),
    )
    .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Waits until `f` gives a value, at most `timeout`.
fn wait_until<T>(what: &str, timeout: Duration, f: impl FnMut() -> Option<T>) -> T {
    holdfast_lab::wait_for(what, timeout, f).unwrap_or_else(|e| panic!("{e}"))
}

/// A scratch directory of this run's own, empty.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("{name}-walk-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("a scratch directory");
    dir
}

/// Deletes a walk's directory when dropped (declared before what runs in it, so dropped
/// after).
struct Scratch(PathBuf);

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pid_in(file: &Path) -> Option<u32> {
    std::fs::read_to_string(file).ok()?.trim().parse().ok()
}

/// At most 1500 characters of a command's output, for the transcript.
fn shortened(text: &str) -> String {
    match text.char_indices().nth(1500) {
        Some((i, _)) => format!("{}[... {} more bytes]\n", &text[..i], text.len() - i),
        None => text.to_string(),
    }
}

/// `resumes N (last X ms)` of a `ctl status`: N and X.
fn last_resume(status: &str) -> Option<(u64, String)> {
    let rest = &status[status.find("resumes ")? + "resumes ".len()..];
    let (count, rest) = rest.split_once(" (last ")?;
    let (ms, _) = rest.split_once(')')?;
    Some((count.trim().parse().ok()?, ms.to_string()))
}

// ---------------------------------------------------------------------------------------
// The walks.

/// Stops a walk's lab if the walk failed half-way, and deletes it and the walk's
/// directory either way.
struct LabDir(PathBuf);

impl Drop for LabDir {
    fn drop(&mut self) {
        // A server left frozen would make `lab down` wait its full minute: thaw it first.
        for node in ["node1", "node2", "node3"] {
            if let Some(pid) = pid_in(&self.0.join(format!("{node}.pid"))) {
                let _ = Command::new("kill")
                    .args(["-CONT", &pid.to_string()])
                    .status();
            }
        }
        let _ = procs::output_within(
            Command::new(holdfast_bin())
                .args(["lab", "down", "--purge", "--dir"])
                .arg(&self.0),
            Duration::from_secs(90),
        );
        if let Some(parent) = self.0.parent() {
            let _ = std::fs::remove_dir_all(parent);
        }
    }
}

/// The README's `holdfast lab up ...` line with `--base-port`: the README's default base
/// port 3310 may be taken on a shared machine, and the README says a second lab needs its
/// own `--base-port`. A layout found taken is tried again elsewhere (`lab up` says so and
/// starts nothing). Also substitutes the README's ports of that layout in later commands.
fn lab_up(w: &mut Walk, line: &str) -> (u16, Out) {
    for _ in 0..10 {
        // Below the ephemeral range: a port chosen there can be taken meanwhile as the
        // local port of any connection (a CI run saw the admin listener's taken).
        let port = common::low_port(64);
        let out = w.run_as_is(&format!("{} --base-port {port}", w.adapt(line)), None);
        if out.status.success() {
            w.sub(
                "-P3310",
                format!("-P{port}"),
                "the README's proxy port (base port): this run's lab's",
            );
            w.sub(
                "-P3312",
                format!("-P{}", port + 2),
                "the README's split listener (base port + 2): this run's lab's",
            );
            return (port, out);
        }
        assert!(
            out.stderr.contains("is in use") && out.stderr.contains("--base-port"),
            "lab up failed for another reason than a taken port:\n{}",
            out.stderr
        );
    }
    panic!("no free port layout for a lab");
}

/// "A serverless instance in two minutes", then the stop paragraph after it.
#[test]
fn readme_walk_a_serverless_instance_in_two_minutes() {
    let section = section("A serverless instance in two minutes");
    // The walk's working directory, and the lab's directory in it.
    let cwd = scratch("hf-sl");
    let dir = cwd.join("hf-sl");
    let _lab = LabDir(dir.clone());
    let mut w = Walk::new(&section, &cwd);
    w.sub(
        "/tmp/hf-sl",
        dir.display().to_string(),
        "the README's directory: this run's own, so parallel runs do not meet",
    );
    let config = dir.join("holdfast.toml");

    // `holdfast lab up --serverless --dir /tmp/hf-sl`: one mariadbd, and the config.
    let up = w.expect("holdfast lab up --serverless --dir /tmp/hf-sl");
    let (base, out) = lab_up(&mut w, &up.text);
    assert!(
        out.stdout.contains("node1") && !out.stdout.contains("node2"),
        "one mariadbd: {}",
        out.stdout
    );
    let toml = std::fs::read_to_string(&config).expect("lab up writes DIR/holdfast.toml");
    assert!(toml.contains("[serverless]"), "{toml}");

    // `holdfast serve --config /tmp/hf-sl/holdfast.toml &`: pauses after 60 s idle.
    let serve = w.expect("holdfast serve --config /tmp/hf-sl/holdfast.toml &");
    assert!(
        serve.comment.contains("after 60 s idle"),
        "{}",
        serve.comment
    );
    assert!(toml.contains("idle_pause_secs = 60"), "{toml}");
    let serve_log = dir.join("serve.log");
    let job = w.background(&serve.text, &serve_log);
    assert_eq!(job, 1, "the README's `kill %1` stops this job");
    let status = wait_until("holdfast serve to answer", SERVE_READY, || {
        status_text(&config).filter(|s| s.contains("running for"))
    });
    assert!(status.contains("(pauses after 60s)"), "{status}");
    // "(ctl reads the admin address and token from the config; the token is in
    // /tmp/hf-sl/admin.token)"
    assert!(
        std::fs::read_to_string(dir.join("admin.token")).is_ok_and(|t| t.trim().len() >= 16),
        "the lab's admin token file"
    );

    // `holdfast ctl ... pause`: `status` shows paused (freeze).
    let pause = w.expect("holdfast ctl -c /tmp/hf-sl/holdfast.toml pause");
    assert!(
        pause.comment.contains("paused (freeze)"),
        "{}",
        pause.comment
    );
    let out = w.run(&pause.text);
    out.ok();
    assert!(out.stdout.contains("paused (freeze)"), "{}", out.stdout);
    let status = w.run_as_is(
        &format!("holdfast ctl -c {} status", config.display()),
        None,
    );
    assert!(status.ok().stdout.contains("paused (freeze)"), "{status:?}");
    let server = pid_in(&dir.join("node1.pid")).expect("node1.pid");
    assert!(procs::is_stopped(server), "the frozen server is SIGSTOPped");

    // `mariadb ... -e 'SELECT 1'`: wakes it.
    let wake = w.expect("mariadb -h127.0.0.1 -P3310 -uapp -papp_pass sbtest -e 'SELECT 1'");
    assert!(wake.comment.starts_with("wakes it"), "{}", wake.comment);
    let out = w.run(&wake.text);
    assert_eq!(out.ok().stdout, "1\n1\n");
    let status = status_text(&config).expect("ctl status");
    let (resumes, freeze_ms) = last_resume(&status).expect("resumes in ctl status");
    assert!(status.contains("running for") && resumes == 1, "{status}");
    w.note(format!(
        "woken from freeze: the instance resumed in {freeze_ms}, the client's command took {} ms",
        out.took.as_millis()
    ));

    // `pause --tier stop`: frees its memory (the server process is gone).
    let stop = w.expect("holdfast ctl -c /tmp/hf-sl/holdfast.toml pause --tier stop");
    assert!(
        stop.comment.contains("frees its memory"),
        "{}",
        stop.comment
    );
    let out = w.run(&stop.text);
    assert!(out.ok().stdout.contains("paused (stop)"), "{}", out.stdout);
    wait_until(
        "the stopped server's process to end",
        COMMAND_TIMEOUT,
        || (!procs::is_alive(server)).then_some(()),
    );

    // `mariadb ... -e 'SELECT 1'`: a cold start.
    let cold = w.expect("mariadb -h127.0.0.1 -P3310 -uapp -papp_pass sbtest -e 'SELECT 1'");
    assert!(cold.comment.starts_with("cold start"), "{}", cold.comment);
    let out = w.run(&cold.text);
    assert_eq!(out.ok().stdout, "1\n1\n");
    let status = status_text(&config).expect("ctl status");
    let (resumes, cold_ms) = last_resume(&status).expect("resumes in ctl status");
    assert!(status.contains("running for") && resumes == 2, "{status}");
    w.note(format!(
        "cold start: the instance resumed in {cold_ms}, the client's command took {} ms",
        out.took.as_millis()
    ));

    // `scale 1.5`: in place; holds until `scale auto` or holdfast restarts.
    let scale = w.expect("holdfast ctl -c /tmp/hf-sl/holdfast.toml scale 1.5");
    assert!(
        scale
            .comment
            .contains("holds until `scale auto` or holdfast restarts"),
        "{}",
        scale.comment
    );
    let out = w.run(&scale.text);
    let said = &out.ok().stdout;
    assert!(
        said.contains("1.5 CCU")
            && said.contains("the autoscaler leaves it until `holdfast ctl scale auto`"),
        "{said}"
    );
    // In place: the same server, its buffer pool at 1.5 x the lab's 128 MiB per CCU.
    let server = pid_in(&dir.join("node1.pid")).expect("node1.pid");
    let pool = w.run_as_is(
        &format!(
            "mariadb -h127.0.0.1 -P{} -uapp -papp_pass -N -e 'SELECT @@innodb_buffer_pool_size'",
            base + 10
        ),
        None,
    );
    assert!(toml.contains("buffer_pool_mib_per_ccu = 128"), "{toml}");
    assert_eq!(pool.ok().stdout.trim(), (192u64 << 20).to_string());
    assert_eq!(
        pid_in(&dir.join("node1.pid")),
        Some(server),
        "not restarted"
    );

    // `usage`: the hourly bill lines from the ledger.
    let usage = w.expect("holdfast ctl -c /tmp/hf-sl/holdfast.toml usage");
    assert!(usage.comment.contains("hourly bill"), "{}", usage.comment);
    let out = w.run(&usage.text);
    let bill = &out.ok().stdout;
    assert!(bill.contains("period start (UTC)"), "{bill}");
    assert!(
        bill.lines()
            .any(|l| l.starts_with("lab ") && l.contains(":00:00")),
        "an hourly line for the instance `lab`: {bill}"
    );
    assert!(
        bill.lines()
            .any(|l| l.split_whitespace().take(2).eq(["lab", "total"])),
        "{bill}"
    );

    // `kill %1`: SIGTERM; holdfast stops, the server keeps answering.
    let kill = w.expect("kill %1");
    assert!(kill.comment.contains("SIGTERM"), "{}", kill.comment);
    let exited = w.signal_job(1, "TERM");
    assert!(exited.success(), "holdfast serve exited with {exited}");
    let log = std::fs::read_to_string(&serve_log).unwrap_or_default();
    assert!(log.contains("terminated; stopping"), "{log}");
    let node_port = base + 10;
    let direct = w.run_as_is(
        &format!("mariadb -h127.0.0.1 -P{node_port} -uapp -papp_pass sbtest -e 'SELECT 1'"),
        None,
    );
    assert_eq!(direct.ok().stdout, "1\n1\n");

    // The paragraph after the block: "the next `holdfast serve` finds it running" and
    // "After SIGKILL nothing thaws it: `kill -CONT $(cat /tmp/hf-sl/node1.pid)` does".
    let job = w.background(&serve.text, &dir.join("serve2.log"));
    let status = wait_until("the second holdfast serve to answer", SERVE_READY, || {
        status_text(&config).filter(|s| s.contains("running for"))
    });
    assert_eq!(
        last_resume(&status).map(|(n, _)| n),
        Some(0),
        "found running, not started again: {status}"
    );
    // The operator's 1.5 CCU held until holdfast restarted (the README says so): a new
    // holdfast starts from start_ccu, by default min_ccu (the lab sets no start_ccu).
    assert!(
        toml.contains("min_ccu = 0.5")
            && !toml.contains("start_ccu")
            && status.contains(", 0.5 CCU,"),
        "{status}"
    );
    w.run(&pause.text).ok();
    let server = pid_in(&dir.join("node1.pid")).expect("node1.pid");
    assert!(procs::is_stopped(server), "frozen again");
    let killed = w.signal_job(job, "KILL");
    assert!(!killed.success());
    assert!(
        procs::is_stopped(server),
        "after SIGKILL nothing thaws it, as the README says"
    );
    let thaw = section.inline_command("kill -CONT");
    assert_eq!(thaw, "kill -CONT $(cat /tmp/hf-sl/node1.pid)");
    w.run(&thaw).ok();
    assert!(!procs::is_stopped(server), "kill -CONT thawed it");
    w.run_as_is(
        &format!("mariadb -h127.0.0.1 -P{node_port} -uapp -papp_pass sbtest -e 'SELECT 1'"),
        None,
    )
    .ok();

    // `holdfast lab down --dir /tmp/hf-sl`: stops mariadbd.
    let down = w.expect("holdfast lab down --dir /tmp/hf-sl");
    assert!(down.comment.contains("stops mariadbd"), "{}", down.comment);
    let out = w.run(&down.text);
    assert!(out.ok().stdout.contains("stopped"), "{}", out.stdout);
    assert!(!procs::is_alive(server), "lab down stopped the server");
    w.finish();
}

/// The server id a `mariadb -e 'SELECT @@server_id'` printed (batch output: a header line,
/// a value). The lab's node *i* has server id *i*.
fn server_id_printed(out: &Out) -> u32 {
    out.stdout
        .strip_prefix("@@server_id\n")
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("`{}` printed no server id: {:?}", out.line, out.stdout))
}

/// "Keep-alive in two minutes (a lab cluster)", then what "What works today" says of the
/// lab: TLS to holdfast verified with the lab's CA, `lab status --json`.
#[test]
fn readme_walk_keep_alive_in_two_minutes() {
    let section = section("Keep-alive in two minutes (a lab cluster)");
    let cwd = scratch("hf-lab");
    let dir = cwd.join("hf-lab");
    let _lab = LabDir(dir.clone());
    let mut w = Walk::new(&section, &cwd);
    w.sub(
        "/tmp/hf-lab",
        dir.display().to_string(),
        "the README's directory: this run's own, so parallel runs do not meet",
    );
    let config = dir.join("holdfast.toml");

    let up = w.expect("holdfast lab up --dir /tmp/hf-lab");
    assert!(up.comment.contains("a GTID primary and two replicas"));
    let (base, out) = lab_up(&mut w, &up.text);
    for node in [
        "node1    primary",
        "node2    replica  node1",
        "node3    replica  node1",
    ] {
        assert!(out.stdout.contains(node), "{node}: {}", out.stdout);
    }
    assert!(config.is_file(), "lab up writes DIR/holdfast.toml");
    let serve = w.expect("holdfast serve --config /tmp/hf-lab/holdfast.toml &");
    assert_eq!(w.background(&serve.text, &cwd.join("serve.log")), 1);
    wait_until(
        "holdfast serve to answer, both replicas taking reads",
        SERVE_READY,
        || {
            status_text(&config)
                .filter(|s| s.contains("primary: node1") && s.matches("taking reads").count() == 2)
        },
    );

    let primary =
        w.expect("mariadb -h127.0.0.1 -P3310 -uapp -papp_pass sbtest -e 'SELECT @@server_id'");
    assert!(primary.comment.contains("node1: 1"), "{}", primary.comment);
    let out = w.run(&primary.text);
    assert_eq!(server_id_printed(out.ok()), 1);

    let split =
        w.expect("mariadb -h127.0.0.1 -P3312 -uapp -papp_pass sbtest -e 'SELECT @@server_id'");
    assert!(
        split.comment.contains("a replica, 2 or 3"),
        "{}",
        split.comment
    );
    let out = w.run(&split.text);
    let id = server_id_printed(out.ok());
    assert!(
        id == 2 || id == 3,
        "the split listener's read ran on server {id}, not a replica"
    );

    // The session that sleeps through the switchover.
    let kept = w.expect("mariadb -h127.0.0.1 -P3310 -uapp -papp_pass sbtest -e 'SET @kept = 42;");
    assert!(kept.text.ends_with('&'), "{}", kept.text);
    let kept_log = cwd.join("kept.log");
    assert_eq!(w.background(&kept.text, &kept_log), 2);
    let first = "@@server_id\t@kept\n1\t42\n";
    // A person sees the first answer before typing the next line. The CLI holds its output
    // back when it is not a terminal, so the walk looks at node1 instead: it waits until
    // node1 runs the session's `DO SLEEP(2)`.
    let sleeping = "SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = 'DO SLEEP(2)'";
    let node1 = dir.join("node1.sock");
    wait_until("the session to sleep on node1", COMMAND_TIMEOUT, || {
        let out = procs::output_within(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", node1.display()))
                .args(["-uroot", "-N", "-e", sleeping]),
            Duration::from_secs(20),
        )
        .ok()?;
        (String::from_utf8_lossy(&out.stdout).trim() == "1").then_some(())
    });
    let switchover = w.expect("holdfast ctl -c /tmp/hf-lab/holdfast.toml switchover --to node2");
    assert!(
        switchover
            .comment
            .contains("the session prints 1 42, then 2 42"),
        "{}",
        switchover.comment
    );
    let out = w.run(&switchover.text);
    assert!(
        out.ok()
            .stdout
            .starts_with("switchover node1 -> node2 done"),
        "{}",
        out.stdout
    );
    let ended = w.wait_job(2, COMMAND_TIMEOUT);
    let printed = std::fs::read_to_string(kept_log.with_extension("out")).unwrap_or_default();
    let errors = std::fs::read_to_string(&kept_log).unwrap_or_default();
    assert!(ended.success(), "the session failed: {errors}");
    assert_eq!(
        printed,
        format!("{first}@@server_id\t@kept\n2\t42\n"),
        "the session kept its connection and @kept, and moved to node2"
    );

    let status = w.expect("holdfast ctl -c /tmp/hf-lab/holdfast.toml status");
    assert!(
        status.comment.contains("primary: node2"),
        "{}",
        status.comment
    );
    let out = w.run(&status.text);
    let said = &out.ok().stdout;
    assert!(said.contains("primary: node2"), "{said}");
    let moved = said
        .split("sessions moved: ")
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse::<u64>().ok());
    assert!(moved.is_some_and(|n| n >= 1), "the session moved: {said}");

    // "What works today": `holdfast lab up` turns TLS on and `lab status --json` names the
    // CA (`ca`), the split listener (`split`) and the admin token (`admin_token`).
    let works = self::section("What works today");
    let tls = works.inline_command("mariadb -h127.0.0.1 -P3310 -uapp -papp_pass --ssl");
    assert!(
        tls.contains("--ssl-ca DIR/tls/ca.pem --ssl-verify-server-cert"),
        "{tls}"
    );
    w.sub(
        "DIR/",
        format!("{}/", dir.display()),
        "the README's placeholder for the lab's directory",
    );
    // An interactive session: what a person would type comes on stdin.
    let out = w.run_as_is(&w.adapt(&tls), Some("SELECT 1;\n"));
    assert_eq!(
        out.ok().stdout,
        "1\n1\n",
        "a TLS login verified against the lab's CA"
    );
    let lab_status = works.inline_command("lab status --json");
    assert_eq!(lab_status, "lab status --json");
    // The README names the subcommand; the lab's directory is this run's.
    let out = w.run_as_is(
        &format!("holdfast lab status --json --dir {}", dir.display()),
        None,
    );
    let json: serde_json::Value =
        serde_json::from_str(&out.ok().stdout).expect("lab status --json is JSON");
    let token = std::fs::read_to_string(dir.join("admin.token")).expect("DIR/admin.token");
    assert_eq!(json["admin_token"].as_str(), Some(token.trim()));
    assert_eq!(
        json["ca"].as_str(),
        Some(dir.join("tls/ca.pem").display().to_string().as_str())
    );
    assert_eq!(
        json["split"].as_str(),
        Some(format!("127.0.0.1:{}", base + 2).as_str())
    );

    let kill = w.expect("kill %1");
    assert!(kill.comment.contains("stops holdfast serve"));
    let exited = w.signal_job(1, "TERM");
    assert!(exited.success(), "holdfast serve exited with {exited}");

    let pids: Vec<u32> = ["node1", "node2", "node3"]
        .iter()
        .filter_map(|n| pid_in(&dir.join(format!("{n}.pid"))))
        .collect();
    assert_eq!(pids.len(), 3, "three running servers");
    let down = w.expect("holdfast lab down --dir /tmp/hf-lab");
    assert!(down.comment.contains("stops the servers"));
    let out = w.run(&down.text);
    assert!(out.ok().stdout.contains("stopped"), "{}", out.stdout);
    for pid in pids {
        assert!(!procs::is_alive(pid), "lab down stopped server {pid}");
    }
    w.finish();
}

/// A fresh `mariadb-install-db` server of "your own", stopped at the end.
struct OwnServer {
    child: Child,
    socket: PathBuf,
    port: u16,
}

impl OwnServer {
    /// `mariadb-install-db` and `mariadbd` with their defaults (names resolved, anonymous
    /// accounts, no binary log): only the paths and the port are this run's own.
    fn start(dir: &Path) -> OwnServer {
        let data = dir.join("data");
        let install = procs::output_within(
            Command::new("mariadb-install-db")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg("--user=root"),
            COMMAND_TIMEOUT,
        )
        .expect("mariadb-install-db");
        assert!(
            install.status.success(),
            "mariadb-install-db: {}",
            String::from_utf8_lossy(&install.stderr)
        );
        for _ in 0..10 {
            let port = common::low_port(0);
            let socket = dir.join("mysqld.sock");
            let child = Command::new("mariadbd")
                .arg("--no-defaults")
                .arg(format!("--datadir={}", data.display()))
                .arg(format!("--port={port}"))
                .arg("--bind-address=127.0.0.1")
                .arg(format!("--socket={}", socket.display()))
                .arg(format!("--pid-file={}", dir.join("mysqld.pid").display()))
                .arg(format!("--log-error={}", dir.join("mysqld.err").display()))
                .arg("--user=root")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("mariadbd");
            let mut server = OwnServer {
                child,
                socket,
                port,
            };
            let up = holdfast_lab::poll(COMMAND_TIMEOUT, || {
                if server.child.try_wait().ok().flatten().is_some() {
                    return Some(false);
                }
                let addr = std::net::SocketAddr::from(([127, 0, 0, 1], port));
                (procs::tcp_accepts(&addr) && server.socket.exists()).then_some(true)
            });
            if up == Some(true) {
                return server;
            }
            server.stop();
        }
        panic!("the server did not start");
    }

    /// SQL as root through the socket (root's default unix_socket login).
    fn root_sql(&self, sql: &str) -> String {
        let out = procs::output_within(
            Command::new("mariadb")
                .arg("--no-defaults")
                .arg(format!("--socket={}", self.socket.display()))
                .args(["-uroot", "--batch", "--skip-column-names", "-e", sql]),
            COMMAND_TIMEOUT,
        )
        .expect("mariadb as root");
        assert!(
            out.status.success(),
            "{sql}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_none() {
            let _ = Command::new("kill")
                .args(["-TERM", &self.child.id().to_string()])
                .status();
            let deadline = Instant::now() + Duration::from_secs(60);
            while self.child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

impl Drop for OwnServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Replaces the one occurrence of `from` in an example config (the example changing under
/// the walk fails it, not silently).
fn edit_once(text: &str, from: &str, to: &str) -> String {
    assert_eq!(
        text.matches(from).count(),
        1,
        "holdfast.example.toml: `{from}` is not there exactly once"
    );
    text.replacen(from, to, 1)
}

/// "Pointing holdfast at an existing server", on a fresh server the walk starts, then the
/// admin API's promises.
#[test]
fn readme_walk_pointing_holdfast_at_an_existing_server() {
    let section = section("Pointing holdfast at an existing server");
    let dir = scratch("hf-own");
    let _scratch = Scratch(dir.clone());
    let server = OwnServer::start(&dir);
    // The newcomer's application account (theirs, not the README's).
    let app_password = "app-secret";
    server.root_sql(&format!(
        "CREATE USER app@'%' IDENTIFIED BY '{app_password}'; GRANT ALL ON *.* TO app@'%'"
    ));
    let mut w = Walk::new(&section, &dir);

    // 1. The monitor account: the SQL block as written, as root.
    let blocks = section.sql_blocks();
    assert_eq!(blocks.len(), 1, "one SQL block in the section");
    assert!(blocks[0].contains("IDENTIFIED BY 'choose-a-password'"));
    let out = w.run_as_is(
        &format!(
            "mariadb --no-defaults --socket={} -uroot",
            server.socket.display()
        ),
        Some(&blocks[0]),
    );
    out.ok();
    // "A fresh `mariadb-install-db` server has anonymous accounts (`''@'localhost'`) ...:
    // drop them (`DROP USER ''@'localhost'`)".
    assert!(
        server
            .root_sql("SELECT CONCAT(User, '@', Host) FROM mysql.user WHERE User = ''")
            .contains("@localhost"),
        "a fresh server has the anonymous accounts the README speaks of"
    );
    let drop_anonymous = section.inline_command("DROP USER");
    assert_eq!(drop_anonymous, "DROP USER ''@'localhost'");
    server.root_sql(&drop_anonymous);

    // 2. Copy the example to a file only you can read, set the password and the backend.
    let copy = section.inline_command("install -m 600");
    w.sub(
        "holdfast.example.toml",
        format!("{REPO}/holdfast.example.toml"),
        "the README runs in the checkout; the walk runs in its own directory",
    );
    w.run(&copy).ok();
    let config = dir.join("holdfast.toml");
    let mode = std::fs::metadata(&config)
        .expect("holdfast.toml")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600);
    let (proxy, admin) = (common::low_port(0), common::low_port(0));
    let mut toml = std::fs::read_to_string(&config).expect("holdfast.toml");
    toml = edit_once(
        &toml,
        "monitor_password = \"\"",
        "monitor_password = \"choose-a-password\"",
    );
    toml = edit_once(
        &toml,
        "address = \"127.0.0.1:3306\"",
        &format!("address = \"127.0.0.1:{}\"", server.port),
    );
    // The example's listeners, 6033 and 6034, may be taken here: free ones instead.
    toml = edit_once(
        &toml,
        "listen = \"127.0.0.1:6033\"",
        &format!("listen = \"127.0.0.1:{proxy}\""),
    );
    toml = edit_once(
        &toml,
        "listen = \"127.0.0.1:6034\"",
        &format!("listen = \"127.0.0.1:{admin}\""),
    );
    std::fs::write(&config, toml).expect("writing holdfast.toml");
    w.sub(
        "-P 6033",
        format!("-P {proxy}"),
        "the example's proxy port: this run's",
    );
    w.sub(
        "127.0.0.1:6034",
        format!("127.0.0.1:{admin}"),
        "the example's admin port: this run's",
    );

    // 3. Check, serve, connect.
    let check = w.expect("holdfast check --config holdfast.toml");
    let out = w.run(&check.text);
    let report = &out.ok().stdout;
    assert!(
        report.contains(&format!("node1 (127.0.0.1:{}): ok", server.port))
            && report.contains("0 problem(s) on 1 node(s)"),
        "the README's grants are all the example config needs: {report}"
    );

    let serve = w.expect("holdfast serve --config holdfast.toml");
    assert!(serve.comment.contains("writes holdfast.admin-token (0600)"));
    let serve_log = dir.join("serve.log");
    let job = w.background(&serve.text, &serve_log);
    wait_until("holdfast serve to answer", SERVE_READY, || {
        status_text(&config).filter(|s| s.contains("primary: node1"))
    });
    let token = dir.join("holdfast.admin-token");
    let mode = std::fs::metadata(&token)
        .expect("serve wrote holdfast.admin-token beside the config")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "the token file is 0600");
    // The start-up check runs beside serving: its verdict may come a moment after.
    let log = holdfast_lab::wait_for("the start-up check's verdict", SERVE_READY, || {
        let log = std::fs::read_to_string(&serve_log).unwrap_or_default();
        log.contains("start-up check: the monitor account can do what this configuration needs")
            .then_some(log)
    })
    .unwrap_or_else(|e| {
        panic!(
            "{e}: {}",
            std::fs::read_to_string(&serve_log).unwrap_or_default()
        )
    });
    assert!(
        !log.contains("can be read by other users"),
        "the config the README has you make draws no warning: {log}"
    );

    let login = w.expect("mariadb -h 127.0.0.1 -P 6033 -u app -p");
    assert_eq!(login.text, "mariadb -h 127.0.0.1 -P 6033 -u app -p");
    // `-p` asks for the password on a terminal; the walk has none.
    let line = format!(
        "{} -p{app_password}",
        w.adapt(&login.text).trim_end_matches(" -p")
    );
    let out = w.run_as_is(&line, Some("SELECT CURRENT_USER();\n"));
    assert_eq!(out.ok().stdout, "CURRENT_USER()\napp@%\n");

    let ctl = w.expect("holdfast ctl --config holdfast.toml status");
    let out = w.run(&ctl.text);
    let status = &out.ok().stdout;
    assert!(
        status.contains("primary: node1")
            && status.lines().any(|l| l.split_whitespace().take(3).eq([
                "node1",
                &format!("127.0.0.1:{}", server.port),
                "true"
            ])),
        "{status}"
    );

    let curl = w.expect("curl -s -H \"Authorization: Bearer $(cat holdfast.admin-token)\"");
    assert!(
        curl.text.ends_with("127.0.0.1:6034/metrics"),
        "{}",
        curl.text
    );
    let out = w.run(&curl.text);
    let metrics = &out.ok().stdout;
    let queries = metrics
        .lines()
        .find_map(|l| l.strip_prefix("holdfast_commands_total{command=\"COM_QUERY\"} "))
        .and_then(|n| n.trim().parse::<u64>().ok());
    assert!(
        queries.is_some_and(|n| n >= 1),
        "the metrics count the query above: {metrics}"
    );
    w.finish();

    // "The admin API and `holdfast ctl`": `GET /health` (`{"status":"ok"}`) without a
    // token; everything else needs one (401 otherwise).
    section_says(
        "The admin API and `holdfast ctl`",
        &["`GET /health` (`{\"status\":\"ok\"}`", "(401 otherwise"],
    );
    let out = w.run_as_is(&format!("curl -s 127.0.0.1:{admin}/health"), None);
    assert_eq!(out.ok().stdout.trim(), "{\"status\":\"ok\"}");
    let out = w.run_as_is(
        &format!("curl -s -o /dev/null -w '%{{http_code}}' 127.0.0.1:{admin}/metrics"),
        None,
    );
    assert_eq!(out.ok().stdout, "401");

    // Stopped as the README says to stop it: SIGTERM.
    let exited = w.signal_job(job, "TERM");
    assert!(exited.success(), "holdfast serve exited with {exited}");
}

/// The section's prose says each of `claims` (what the walk holds the product to).
fn section_says(title: &str, claims: &[&str]) {
    let s = section(title);
    let text = s.text.split_whitespace().collect::<Vec<_>>().join(" ");
    for claim in claims {
        assert!(
            text.contains(claim),
            "the README's section `{title}` no longer says {claim}: update the walk"
        );
    }
}

/// Every shell command of the README is run by a walk or named in [`NOT_RUN`] with its
/// reason; what can be checked of the ones not run is.
#[test]
fn readme_walk_runs_or_names_every_command() {
    let all = sections();
    for title in WALKED {
        assert!(
            all.iter().any(|s| s.title == *title),
            "README.md has no section `## {title}` any more"
        );
    }
    let mut named = Vec::new();
    for s in all.iter().filter(|s| !WALKED.contains(&s.title.as_str())) {
        for cmd in s.shell_commands() {
            assert!(
                NOT_RUN.iter().any(|(c, _)| *c == cmd.text),
                "README section `{}`: `{}` is neither run by a README walk nor named in \
                 NOT_RUN with the reason",
                s.title,
                cmd.text
            );
            named.push(cmd.text);
        }
    }
    for (cmd, why) in NOT_RUN {
        assert!(
            named.iter().any(|c| c == cmd),
            "NOT_RUN names `{cmd}` ({why}), which the README no longer has"
        );
    }

    // What can be checked of them without running them.
    let repo = Path::new(REPO);
    for script in ["scripts/demo.sh", "scripts/test.sh"] {
        assert!(repo.join(script).is_file(), "{script}");
    }
    assert!(
        repo.join("Cargo.lock").is_file(),
        "`--locked` needs Cargo.lock"
    );
    for (crate_dir, bin) in [
        ("crates/holdfast", "holdfast"),
        ("crates/bench", "holdfast-bench"),
    ] {
        let manifest = std::fs::read_to_string(repo.join(crate_dir).join("Cargo.toml"))
            .unwrap_or_else(|e| panic!("{crate_dir}/Cargo.toml: {e}"));
        assert!(
            manifest.contains(&format!("name = \"{bin}\"")),
            "`cargo install --path {crate_dir}` installs `{bin}`"
        );
    }
    // "Without installing, the binaries `scripts/demo.sh` built are target/release/...".
    let demo = std::fs::read_to_string(repo.join("scripts/demo.sh")).expect("demo.sh");
    assert!(
        demo.contains("cargo build --release") && demo.contains("-p holdfast -p holdfast-bench"),
        "{demo}"
    );
    let install = section("Installing");
    assert!(install.text.contains("`target/release/holdfast`"));
}
