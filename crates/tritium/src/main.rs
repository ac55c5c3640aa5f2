//! The `tritium` binary: `tritium serve` runs the server; other subcommands talk to a running one.

mod logging;
mod serve;

use clap::{Parser, Subcommand};

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
    Serve(serve::ServeArgs),
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
    }
}
