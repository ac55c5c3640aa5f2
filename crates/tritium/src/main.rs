//! The `tritium` binary: `tritium serve` runs the server; other subcommands talk to a running one.

// Doc comments of clap structs are the CLI's help text, written for a terminal, not as HTML.
#![allow(rustdoc::invalid_html_tags)]

mod alloc;
mod cli;
mod logging;
mod metrics_http;
mod reload;
mod sdnotify;
mod serve;
mod triton_flags;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// mimalloc instead of glibc's malloc: the request path allocates and frees small buffers on
/// every hop (HTTP/2 frames, protobuf messages, JSON), and glibc's malloc and free were 9% of the
/// server's CPU under load (ARCHITECTURE.md, "What the server spends per request").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// tritium: serves Triton Python-backend model repositories over KServe v2 (HTTP and gRPC).
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve a model repository (Triton's layout: <repo>/<model>/config.pbtxt, <repo>/<model>/1/model.py).
    Serve(Box<serve::ServeArgs>),
    #[command(flatten)]
    Client(cli::Command),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Client(command) => cli::run(command),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprint!("{}", error_text(&e));
            ExitCode::FAILURE
        }
    }
}

/// An error as the binary prints it: `tritium: ` and the reason with its causes on one line;
/// a multi-line reason (a stub's last stderr lines) continues indented below it.
fn error_text(e: &anyhow::Error) -> String {
    let text = format!("{e:#}");
    let mut lines = text.lines();
    let mut out = format!("tritium: {}\n", lines.next().unwrap_or("failed"));
    for line in lines {
        out.push_str("  ");
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_print_as_one_line_then_details() {
        let e = anyhow::anyhow!("connection refused").context("cannot reach the server at 127.0.0.1:8001");
        assert_eq!(error_text(&e), "tritium: cannot reach the server at 127.0.0.1:8001: connection refused\n");
        let e = anyhow::anyhow!("restart of m failed: stub died; last stderr lines:\nTraceback\nValueError");
        assert_eq!(
            error_text(&e),
            "tritium: restart of m failed: stub died; last stderr lines:\n  Traceback\n  ValueError\n"
        );
    }

    /// clap checks a command's definition only in debug builds, and the suite runs in release:
    /// flags merged from several places (`ServeArgs`, `TritonFlags`) must not share a long name
    /// or an environment variable.
    #[test]
    fn no_two_flags_share_a_name_or_an_environment_variable() {
        use clap::CommandFactory;
        let cli = Cli::command();
        for sub in cli.get_subcommands() {
            let mut longs = std::collections::HashSet::new();
            let mut envs = std::collections::HashSet::new();
            for arg in sub.get_arguments() {
                let names = arg.get_long().into_iter().chain(arg.get_all_aliases().into_iter().flatten());
                for name in names {
                    assert!(longs.insert(name.to_string()), "`{} --{name}` is defined twice", sub.get_name());
                }
                if let Some(env) = arg.get_env() {
                    let env = env.to_string_lossy().to_string();
                    assert!(envs.insert(env.clone()), "`{}`: {env} is read by two flags", sub.get_name());
                }
            }
            assert!(sub.get_name() != "serve" || longs.contains("model-store"), "{longs:?}");
        }
    }

    /// `tritium serve --help` groups every flag as tritonserver's help does, and tritium's own
    /// under a heading of their own.
    #[test]
    fn every_serve_flag_has_a_heading_and_tritiums_own_are_marked() {
        use clap::CommandFactory;
        let cli = Cli::command();
        let serve = cli.find_subcommand("serve").expect("serve");
        let heading = |long: &str| {
            let arg = serve.get_arguments().find(|a| a.get_long() == Some(long)).expect(long);
            arg.get_help_heading().unwrap_or_default().to_string()
        };
        for arg in serve.get_arguments().filter(|a| a.get_long() != Some("help")) {
            assert!(arg.get_help_heading().is_some(), "--{} has no heading", arg.get_long().unwrap_or_default());
        }
        for own in ["host", "python", "stub-init-timeout-secs", "openai-port", "max-output-bytes", "admin-token"] {
            assert_eq!(heading(own), "tritium (not in tritonserver)", "--{own}");
        }
        for (flag, group) in
            [("http-port", "HTTP"), ("model-repository", "Model Repository"), ("log-verbose", "Logging")]
        {
            assert_eq!(heading(flag), group, "--{flag}");
        }
    }
}
