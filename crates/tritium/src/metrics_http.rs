//! The `/metrics` HTTP endpoint (Triton's metrics port, 8002 by default), serving the page that
//! `tritium-metrics` renders.

use std::future::Future;
use std::sync::Arc;

use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use axum::Router;
use tokio::net::TcpListener;
use tritium_metrics::CONTENT_TYPE;

/// Serves `GET /metrics` (and `HEAD`) on `listener` with the text `render` returns, until
/// `shutdown` completes; then finishes the requests in progress and returns.
///
/// `render` runs on a blocking thread, so a slow snapshot never stalls the runtime. Other
/// methods on `/metrics` get 405, other paths 404.
pub(crate) async fn serve<R, S>(listener: TcpListener, render: R, shutdown: S) -> std::io::Result<()>
where
    R: Fn() -> String + Send + Sync + 'static,
    S: Future<Output = ()> + Send + 'static,
{
    let render = Arc::new(render);
    let app = Router::new()
        .route(
            "/metrics",
            get(move || {
                let render = Arc::clone(&render);
                async move { metrics_response(render).await }
            }),
        )
        .fallback(|| async { (StatusCode::NOT_FOUND, "Not Found: the metrics are at /metrics\n") });
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

async fn metrics_response<R>(render: Arc<R>) -> Response
where
    R: Fn() -> String + Send + Sync + 'static,
{
    match tokio::task::spawn_blocking(move || render()).await {
        Ok(body) => ([(header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response(),
        Err(error) => {
            tracing::error!(%error, "rendering /metrics failed");
            (StatusCode::INTERNAL_SERVER_ERROR, format!("rendering the metrics failed: {error}\n")).into_response()
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    async fn request(addr: std::net::SocketAddr, method: &str, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("{method} {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).await.unwrap();
        response
    }

    #[tokio::test]
    async fn serves_metrics_404s_elsewhere_and_shuts_down() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let scrapes = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counter = Arc::clone(&scrapes);
        let render = move || {
            let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
            format!("# TYPE scrapes counter\nscrapes {n}\n")
        };
        let server = tokio::spawn(serve(listener, render, async {
            let _ = stopped.await;
        }));

        let response = request(addr, "GET", "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 200 OK\r\n"), "{response}");
        assert!(
            response.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"),
            "{response}"
        );
        assert!(response.ends_with("\r\n\r\n# TYPE scrapes counter\nscrapes 1\n"), "{response}");
        let response = request(addr, "GET", "/metrics").await;
        assert!(response.ends_with("scrapes 2\n"), "{response}");

        let response = request(addr, "GET", "/v2/health/ready").await;
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"), "{response}");
        let response = request(addr, "GET", "/metrics/extra").await;
        assert!(response.starts_with("HTTP/1.1 404 Not Found\r\n"), "{response}");
        let response = request(addr, "POST", "/metrics").await;
        assert!(response.starts_with("HTTP/1.1 405 Method Not Allowed\r\n"), "{response}");
        assert_eq!(scrapes.load(std::sync::atomic::Ordering::SeqCst), 2);

        stop.send(()).unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(10), server).await.unwrap().unwrap().unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err());
    }
}
