//! The built-in demo agent (`agui-fanout demo-agent`) as a child process of the real binary,
//! for tests that need an AG-UI agent upstream (and one they can SIGKILL mid-run).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

/// A running `agui-fanout demo-agent`; killed (SIGKILL) on drop.
pub struct DemoAgent {
    /// The child.
    pub child: Child,
    /// Its URL, `http://127.0.0.1:<port>` (the agent answers `POST /`).
    pub url: String,
}

impl DemoAgent {
    /// Spawns `agui-fanout demo-agent --listen 127.0.0.1:0` with `args` (e.g. `--pace 0`,
    /// `--fail-after 7`) and waits for the line announcing its address. The socket is bound
    /// before that line is printed, so the agent accepts connections from then on.
    pub fn spawn(args: &[&str]) -> DemoAgent {
        let mut child = Command::new(env!("CARGO_BIN_EXE_agui-fanout"))
            .args(["demo-agent", "--listen", "127.0.0.1:0"])
            .args(args)
            .env("AGUI_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn agui-fanout demo-agent");
        let stdout = child.stdout.take().expect("piped stdout");
        let mut lines = BufReader::new(stdout);
        let mut first = String::new();
        lines
            .read_line(&mut first)
            .expect("read the demo agent's first line");
        let url = first
            .trim()
            .strip_prefix("demo agent listening on ")
            .unwrap_or_else(|| panic!("unexpected first line from demo-agent: {first:?}"))
            .to_string();
        // Keep draining its stdout (its log), so a write never fails on a closed pipe.
        std::thread::spawn(move || std::io::copy(&mut lines, &mut std::io::sink()));
        DemoAgent { child, url }
    }

    /// SIGKILLs the agent and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for DemoAgent {
    fn drop(&mut self) {
        self.kill();
    }
}
