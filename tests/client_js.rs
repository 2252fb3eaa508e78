//! The TypeScript client package (`clients/js`, `@agui-fanout/client`) against the real binary:
//! its `node:test` suites in `clients/js/test/` start brokers, the demo agent and the token
//! issuer from the binary cargo built (`AGUI_FANOUT_BIN`), and check that `FanoutAgent` ends
//! with the log's fold through the gateway (`gateway.test.mjs`), an in-memory broker restarted
//! mid-run (`restart.test.mjs`), tokens expiring mid-run (`token.test.mjs`) and trimmed ids
//! (`trimmed.test.mjs`). The package must be built first:
//! `npm ci --prefix clients/js && npm run build --prefix clients/js` (scripts/test.sh does it).

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant, SystemTime};

/// One suite at a time: they time token expiries and reconnects on a shared, small machine.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

fn package_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("clients/js")
}

/// The newest modification time of the files directly in `dir` (`UNIX_EPOCH` for none).
fn newest(dir: &Path) -> SystemTime {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
                .max()
                .unwrap_or(SystemTime::UNIX_EPOCH)
        })
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

/// Runs `node --test` on `files` of `clients/js/test/` and asserts that every test passed.
fn run_node_tests(files: &[&str]) {
    // A suite that failed poisons the lock; the next one runs all the same.
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner());
    let dir = package_dir();
    let built = dir.join("dist/index.js");
    assert!(
        built.exists() && dir.join("node_modules/@ag-ui/client/package.json").exists(),
        "clients/js is not built: run `npm ci --prefix clients/js && npm run build --prefix \
         clients/js` first (scripts/test.sh does it)"
    );
    assert!(
        newest(&dir.join("src")) <= newest(&dir.join("dist")),
        "clients/js/dist is older than clients/js/src: run `npm run build --prefix clients/js`"
    );
    let mut child = Command::new("node")
        .current_dir(&dir)
        // A test that hangs fails after 2 minutes, with the others' results.
        .args([
            "--test",
            "--test-concurrency=1",
            "--test-timeout=120000",
            "--test-reporter=spec",
        ])
        .args(files.iter().map(|f| format!("test/{f}")))
        .env("AGUI_FANOUT_BIN", env!("CARGO_BIN_EXE_agui-fanout"))
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run `node` (Node.js 20+ is needed): {e}"));
    let read = |mut pipe: Box<dyn Read + Send>| {
        std::thread::spawn(move || {
            let mut text = String::new();
            let _ = pipe.read_to_string(&mut text);
            text
        })
    };
    let stdout = read(Box::new(child.stdout.take().expect("piped stdout")));
    let stderr = read(Box::new(child.stderr.take().expect("piped stderr")));
    // And a process that does not exit (a handle left open) is killed after 6.
    let deadline = Instant::now() + Duration::from_secs(360);
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait for node") {
            break Some(status);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = stdout.join().expect("stdout reader");
    let stderr = stderr.join().expect("stderr reader");
    assert!(
        status.is_some_and(|s| s.success()),
        "node --test {files:?} failed ({status:?}; None: killed after 6 minutes):\n--- stdout\n\
         {stdout}\n--- stderr\n{stderr}"
    );
    // A suite that ran nothing would pass too: every file must have run its tests.
    assert!(
        stdout.contains("ℹ fail 0") && !stdout.contains("ℹ tests 0"),
        "{stdout}"
    );
}

/// The pure parts: the SSE reader, event-id order, the JWT `exp`.
#[test]
fn client_js_units() {
    run_node_tests(&["unit.test.mjs"]);
}

/// `runAgent()` through the gateway (PROTOCOL §11) and `connectAgent()` followers, live, late
/// and the runner itself, all ending with the log's fold; a following runner applies every
/// event once; `cancelRun()` ends the run for the caller and the followers.
#[test]
fn client_js_runs_through_the_gateway_and_follows() {
    run_node_tests(&["gateway.test.mjs"]);
}

/// The follow through an in-memory broker restart (a new epoch), tokens that expire mid-run,
/// and a trimmed id: a prelude restarts the pipeline, never an error.
#[test]
fn client_js_follows_through_restarts_expiries_and_trims() {
    run_node_tests(&["restart.test.mjs", "token.test.mjs", "trimmed.test.mjs"]);
}
