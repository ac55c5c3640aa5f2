//! Stubs forked from a fork server: the stub is this process's child (it is a child subreaper),
//! serves, and its exit status is read as a plain stub's is; a model's opt-out starts it plainly;
//! an orphan a stub leaves behind is reaped. One test: the fork-server switch is process-wide.

mod common;

use std::time::{Duration, Instant};

use common::{stub_command, Model};
use tritium_host::{reap_orphans, set_fork_server, Stub, StubExit, NO_FORK_SERVER_ENV};

fn cmdline(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .map(|b| String::from_utf8_lossy(&b).replace('\0', " "))
        .unwrap_or_default()
}

fn ppid(pid: u32) -> u32 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("PPid:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

#[test]
fn forked_stubs_are_supervised_like_plain_ones() {
    set_fork_server(true);
    let model = Model::new(
        "orphans",
        r#"
import subprocess
import triton_python_backend_utils as pb_utils

class TritonPythonModel:
    def initialize(self, args):
        # A grandchild that outlives its parent: it becomes an orphan of the server.
        subprocess.Popen(["sh", "-c", "sleep 0.3 & echo $! > /dev/null"])

    def execute(self, requests):
        return [pb_utils.InferenceResponse([]) for _ in requests]
"#,
    );
    let stub = model.start();
    let pid = stub.pid();
    assert!(cmdline(pid).contains("tritium.forkserver"), "{}", cmdline(pid));
    assert_eq!(ppid(pid), std::process::id(), "a forked stub is reparented to the server");
    assert_eq!(stub.info().pid, pid);
    let done = stub.execute(vec![common::request(1, vec![])], Some(Duration::from_secs(60))).expect("execute");
    assert_eq!(done.responses.len(), 1);

    // The orphaned `sleep` becomes this process's child when its shell exits, then a zombie;
    // reap_orphans reaps it (and leaves the stub alone).
    let zombies = || {
        std::fs::read_dir("/proc")
            .expect("/proc")
            .flatten()
            .filter_map(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()))
            .filter(|&p| ppid(p) == std::process::id())
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.rsplit(')').next().is_some_and(|r| r.trim_start().starts_with('Z')))
            })
            .count()
    };
    std::thread::sleep(Duration::from_secs(1));
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        reap_orphans();
        let left = zombies();
        if left == 0 {
            break;
        }
        assert!(Instant::now() < deadline, "{left} zombie children left");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(stub.try_exit().is_none(), "the stub is still running");

    // Killed, its exit status is the signal, as for a plain stub.
    assert_eq!(stub.kill(), StubExit::signal(libc::SIGKILL));

    // A model that opts out starts `python -m tritium.stub`.
    let mut cmd = stub_command();
    cmd.env.push((NO_FORK_SERVER_ENV.into(), "1".into()));
    let plain = Stub::spawn(&cmd, "plain_0_0", Duration::from_secs(60)).expect("spawn");
    assert!(cmdline(plain.pid()).contains("tritium.stub"), "{}", cmdline(plain.pid()));
    assert_eq!(plain.kill(), StubExit::signal(libc::SIGKILL));
}
