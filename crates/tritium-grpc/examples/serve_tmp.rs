//! Temporary manual-test server: `serve_tmp <repo> <port> <models...>`.
use std::time::Duration;
use tritium_host::StubCommand;
use tritium_server::{Server, ServerOptions};

#[tokio::main]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let stub = StubCommand { python: root.join(".venv/bin/python"), python_path: root.join("python"), env: Vec::new(), spin: 0 };
    let server = Server::new(ServerOptions {
        repository: args[1].clone().into(),
        stub,
        init_timeout: Duration::from_secs(60),
        auto_complete: true,
        strict_readiness: true,
        explicit_control: true,
    });
    for m in &args[3..] {
        server.load_model(m).await.expect("load");
    }
    let listener = tokio::net::TcpListener::bind(format!("127.0.0.1:{}", args[2])).await.expect("bind");
    eprintln!("serving");
    tritium_grpc::serve(listener, server.clone(), async {
        let _ = tokio::signal::ctrl_c().await;
    })
    .await
    .expect("serve");
    server.shutdown().await;
}
