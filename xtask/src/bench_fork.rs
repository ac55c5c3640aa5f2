//! `cargo xtask bench fork [FLAGS]`: what starting a stub costs (issue 36 part 1), printed next
//! to the targets. `FLAGS` go to `tritium serve` (e.g. `--stub-fork-server=false`, today's plain
//! starts, to compare on one build).
//!
//! One server in explicit mode with a copy of `examples/models/add_sub` loaded:
//! - restart to ready: `tritium restart add_sub` (the CLI, which returns once the new stub is
//!   ready), wall time, the median of 7;
//! - 16 instances: `tritium load add_sub16` (a copy with `count: 16`, returns once all are ready),
//!   the median of 3 loads (each after an unload);
//! - PSS per additional instance: the PSS (`/proc/<pid>/smaps_rollup`) of every process below the
//!   server, with add_sub16 loaded less without it, over 16;
//! - idle wake-ups of one add_sub stub: the voluntary context switches of all its threads over
//!   10 s idle, per second.
//!
//! Then servers with 1 and with 48 copies of add_sub (one instance each, all loaded at start):
//! time to ready, the server process's OS threads (`/proc/<pid>/task`) and its PSS a second
//! after ready, and its threads again 12 s after ready, once the threads the runtime's blocking
//! pool started for the stubs' starts have passed their keep-alive (10 s) and ended.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};

use crate::servers::{free_ports, load_average, tritium_command, Server, TempDir};
use crate::{root, target_dir};

/// The targets of issue 36.
const RESTART_TARGET_MS: f64 = 50.0;
const LOAD16_TARGET_MS: f64 = 500.0;
const PSS_PER_INSTANCE_TARGET_MIB: f64 = 8.0;
const SERVER_PSS_PER_INSTANCE_TARGET_MIB: f64 = 0.5;

const RESTARTS: usize = 7;
const LOADS: usize = 3;
const IDLE: Duration = Duration::from_secs(10);
const MANY: usize = 48;

pub(crate) fn bench_fork(flags: &[String]) -> Result<()> {
    let root = root();
    let tritium = target_dir().join("release/tritium");
    let logs = target_dir().join("bench-fork");
    std::fs::create_dir_all(&logs)?;
    let example = root.join("examples/models/add_sub");
    let config = std::fs::read_to_string(example.join("config.pbtxt"))?;
    let model_py = std::fs::read_to_string(example.join("1/model.py"))?;
    let load_before = load_average();

    let repo = TempDir::new("tritium-bench-fork")?;
    write_model(&repo.0, "add_sub", &config, &model_py, 1)?;
    write_model(&repo.0, "add_sub16", &config, &model_py, 16)?;
    let ports = free_ports::<3>()?;
    let mut cmd = tritium_command(&root, &tritium, &repo.0, ports);
    cmd.args(["--model-control-mode", "explicit", "--load-model", "add_sub"]).args(flags);
    let mut server = Server::start("tritium", cmd, &logs.join("tritium.log"), ports[0], ports[1])?;
    server.wait_ready()?;
    let url = format!("127.0.0.1:{}", ports[1]);
    let cli = |args: &[&str]| -> Result<Duration> {
        let start = Instant::now();
        let out = Command::new(&tritium).args(args).args(["--url", &url]).output()?;
        let took = start.elapsed();
        if !out.status.success() {
            bail!("tritium {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        Ok(took)
    };
    // A first restart warms the page cache and the CLI.
    cli(&["restart", "add_sub"])?;
    let mut restarts = (0..RESTARTS).map(|_| cli(&["restart", "add_sub"]).map(ms)).collect::<Result<Vec<_>>>()?;
    let restart_ms = median(&mut restarts);

    let stubs = descendants(server.pid());
    let listed = Command::new(&tritium).args(["stubs", "add_sub", "--json", "--url", &url]).output()?;
    let listed: serde_json::Value = serde_json::from_slice(&listed.stdout).context("tritium stubs --json")?;
    let stub = listed[0]["pid"].as_u64().context("tritium stubs lists no pid for add_sub")? as u32;
    let wakeups = idle_wakeups(stub);

    let pss_one = tree_pss_kib(server.pid());
    let mut loads = Vec::new();
    let mut pss_per_instance = Vec::new();
    for i in 0..LOADS {
        if i > 0 {
            cli(&["unload", "add_sub16"])?;
            // The unloaded stubs exit after their finalize.
            wait_for(|| descendants(server.pid()).len() <= stubs.len(), Duration::from_secs(30));
        }
        loads.push(ms(cli(&["load", "add_sub16"])?));
        pss_per_instance.push((tree_pss_kib(server.pid()) - pss_one) as f64 / 16.0 / 1024.0);
    }
    let load16_ms = median(&mut loads);
    let pss_mib = median(&mut pss_per_instance);
    drop(server);

    let mut many = Vec::new();
    for count in [1, MANY] {
        let repo = TempDir::new(&format!("tritium-bench-fork-{count}"))?;
        for i in 0..count {
            write_model(&repo.0, &format!("add_sub_{i}"), &config, &model_py, 1)?;
        }
        let ports = free_ports::<3>()?;
        let mut cmd = tritium_command(&root, &tritium, &repo.0, ports);
        cmd.args(flags);
        let start = Instant::now();
        let mut server = Server::start("tritium", cmd, &logs.join(format!("tritium-{count}.log")), ports[0], ports[1])?;
        server.wait_ready()?;
        let ready = start.elapsed();
        // Let start-up threads (loaders) finish.
        std::thread::sleep(Duration::from_secs(1));
        let threads = || std::fs::read_dir(format!("/proc/{}/task", server.pid())).map(|d| d.count()).unwrap_or(0);
        let at_ready = threads();
        let pss = pss_kib(server.pid());
        // Then the threads the runtime's blocking pool started for the stubs' starts, which end
        // after its keep-alive (10 s) idle.
        std::thread::sleep(Duration::from_secs(11));
        many.push((count, ready, at_ready, threads(), pss));
    }

    println!("bench fork (tritium flags: {flags:?}); load average {load_before} before, {} after", load_average());
    println!("{:<44} {:>10} {:>10}", "", "measured", "target");
    println!("{:<44} {:>8.1}ms {:>8.0}ms", "restart add_sub to ready (median of 7)", restart_ms, RESTART_TARGET_MS);
    println!("{:<44} {:>8.1}ms {:>8.0}ms", "16 instances loaded and ready (median of 3)", load16_ms, LOAD16_TARGET_MS);
    println!(
        "{:<44} {:>7.1}MiB {:>7.0}MiB",
        "PSS per additional instance (median of 3)", pss_mib, PSS_PER_INSTANCE_TARGET_MIB
    );
    println!("{:<44} {:>9.1}/s", "idle stub wake-ups (all threads, 10 s)", wakeups);
    for (count, ready, threads, idle, pss) in &many {
        println!(
            "{count:>2} models: ready after {:>6.0}ms, server threads {threads:>4} ({idle} 12 s later), server PSS {:>6.1}MiB",
            ms(*ready),
            *pss as f64 / 1024.0
        );
    }
    if let [(_, _, t1, i1, p1), (_, _, tn, i_n, pn)] = many[..] {
        let per = |a: usize, b: usize| (b as f64 - a as f64) / (MANY - 1) as f64;
        println!(
            "server per additional instance: {:+.2} threads ({:+.2} 12 s later), {:+.2}MiB PSS (target 0 threads, {SERVER_PSS_PER_INSTANCE_TARGET_MIB}MiB)",
            per(t1, tn),
            per(i1, i_n),
            (pn as f64 - p1 as f64) / 1024.0 / (MANY - 1) as f64
        );
    }
    Ok(())
}

fn write_model(repo: &Path, name: &str, config: &str, model_py: &str, count: u32) -> Result<()> {
    let dir = repo.join(name);
    std::fs::create_dir_all(dir.join("1"))?;
    let config = config
        .replace("name: \"add_sub\"", &format!("name: \"{name}\""))
        .replace("count: 1 }", &format!("count: {count} }}"));
    if !config.contains(&format!("count: {count} }}")) {
        bail!("examples/models/add_sub/config.pbtxt has no `count: 1 }}` to change");
    }
    std::fs::write(dir.join("config.pbtxt"), config)?;
    std::fs::write(dir.join("1/model.py"), model_py)?;
    Ok(())
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

fn wait_for(mut done: impl FnMut() -> bool, limit: Duration) {
    let deadline = Instant::now() + limit;
    while !done() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Every process below `pid`.
fn descendants(pid: u32) -> Vec<u32> {
    let mut all = Vec::new();
    let mut stack = vec![pid];
    while let Some(p) = stack.pop() {
        let kids: Vec<u32> = std::fs::read_dir(format!("/proc/{p}/task"))
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
            .flat_map(|s| s.split_whitespace().filter_map(|w| w.parse().ok()).collect::<Vec<u32>>())
            .collect();
        all.extend(&kids);
        stack.extend(kids);
    }
    all
}

/// A process's PSS in KiB (0 when it is gone).
fn pss_kib(pid: u32) -> i64 {
    std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("Pss:").and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok()))
        })
        .unwrap_or(0)
}

/// The PSS of every process below `pid`, in KiB.
fn tree_pss_kib(pid: u32) -> i64 {
    descendants(pid).into_iter().map(pss_kib).sum()
}

/// Voluntary context switches of all threads of `pid`.
fn switches(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("status")).ok())
        .filter_map(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:").and_then(|v| v.trim().parse::<u64>().ok()))
        })
        .sum()
}

/// Wake-ups per second of an idle `pid` over [`IDLE`].
fn idle_wakeups(pid: u32) -> f64 {
    let before = switches(pid);
    std::thread::sleep(IDLE);
    (switches(pid).saturating_sub(before)) as f64 / IDLE.as_secs_f64()
}
