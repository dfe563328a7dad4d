//! `lockbench run --metrics-addr`: the workers' lock metrics, merged, in
//! Prometheus text format, for the length of the run.

use std::convert::Infallible;
use std::net::SocketAddr;

use anyhow::Context;
use bytes::Bytes;
use harness::coordinator::LiveWorkers;
use http_body_util::Full;
use hyper::{Request, Response};
use tokio::net::TcpListener;

/// Binds `addr`, refusing anything but loopback: these pages are for a
/// scraper on this machine.
pub(crate) async fn bind(addr: SocketAddr) -> anyhow::Result<TcpListener> {
    anyhow::ensure!(
        addr.ip().is_loopback(),
        "--metrics-addr {addr}: only a loopback address (127.0.0.0/8 or [::1]) is served"
    );
    let l = TcpListener::bind(addr)
        .await
        .with_context(|| format!("--metrics-addr {addr}: cannot listen there"))?;
    let at = l.local_addr().unwrap_or(addr);
    eprintln!("metrics: http://{at}/metrics (Prometheus text format, for the length of the run)");
    Ok(l)
}

/// Serves `GET /metrics` (the merged page, empty until the first worker
/// reported) until the task is aborted; any other path is a 404.
pub(crate) fn serve(listener: TcpListener, live: LiveWorkers) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            let stream = match listener.accept().await {
                Ok((s, _)) => s,
                Err(e) => {
                    // Out of file descriptors, say: back off, do not spin.
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            };
            let live = live.clone();
            tokio::spawn(async move {
                let page =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let live = live.clone();
                        async move { Ok::<_, Infallible>(respond(&req, &live)) }
                    });
                let io = hyper_util::rt::TokioIo::new(stream);
                if let Err(e) = hyper::server::conn::http1::Builder::new()
                    .serve_connection(io, page)
                    .await
                {
                    tracing::debug!(error = %e, "metrics connection ended");
                }
            });
        }
    })
}

fn respond<B>(req: &Request<B>, live: &LiveWorkers) -> Response<Full<Bytes>> {
    let (status, body) = if req.uri().path() == "/metrics" {
        (200, live.metrics_page())
    } else {
        (404, "not found: the metrics are at /metrics\n".to_string())
    };
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = hyper::StatusCode::from_u16(status).unwrap_or(hyper::StatusCode::OK);
    r.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    r
}
