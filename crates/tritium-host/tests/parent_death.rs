//! A stub exits by itself when its server is killed with SIGKILL.

mod common;

use std::io::BufRead;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

fn alive(pid: i32) -> bool {
    // Zombies count as gone: their parent (the killed server) can no longer reap them, init will.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => !stat.split(") ").nth(1).is_some_and(|rest| rest.starts_with('Z')),
        Err(_) => false,
    }
}

#[test]
fn stub_exits_when_its_parent_is_killed() {
    let cmd = stub_command();
    let model = Model::new("orphan", "class TritonPythonModel:\n    def execute(self, requests):\n        return []\n");
    // The example binary is built next to this test's executable, under target/<profile>/examples.
    let exe = std::env::current_exe().expect("exe");
    let example: PathBuf = exe.parent().and_then(|d| d.parent()).expect("target dir").join("examples/serve_one");
    assert!(example.exists(), "{} missing: cargo test builds examples", example.display());
    let mut parent = Command::new(&example)
        .arg(model.file())
        .arg(&cmd.python)
        .arg(&cmd.python_path)
        .stdout(Stdio::piped())
        .spawn()
        .expect("start parent");
    let mut line = String::new();
    std::io::BufReader::new(parent.stdout.take().expect("stdout")).read_line(&mut line).expect("pid line");
    let stub_pid: i32 = line.trim().parse().unwrap_or_else(|_| panic!("parent printed {line:?}"));
    assert!(alive(stub_pid));
    parent.kill().expect("kill -9 the parent");
    parent.wait().expect("reap parent");
    let killed = Instant::now();
    while alive(stub_pid) && killed.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(10));
    }
    assert!(!alive(stub_pid), "stub {stub_pid} outlived its parent by 2 s");
}
