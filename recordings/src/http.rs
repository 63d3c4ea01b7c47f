//! object_store's HTTP requests, sent by the workspace's reqwest (0.12, rustls on aws-lc-rs,
//! webpki roots). object_store's own connector is on reqwest 0.13, which would bring a second
//! reqwest, hyper-rustls and rustls set-up into the tree; its `HttpService` trait lets any client
//! carry the requests it signs.

use std::time::Duration;

use http_body_util::BodyExt;
use object_store::client::{
    HttpClient, HttpConnector, HttpError, HttpErrorKind, HttpRequest, HttpResponse,
    HttpResponseBody, HttpService,
};
use object_store::{ClientOptions, Result};

/// Builds the reqwest client object_store sends through.
#[derive(Debug, Default)]
pub(crate) struct Connector;

impl HttpConnector for Connector {
    fn connect(&self, _options: &ClientOptions) -> Result<HttpClient> {
        // reqwest's rustls takes the process's provider and panics without one; every main
        // installs it, and so does this (idempotent) for a store built before or without one.
        sallyport_core::install_crypto_provider();
        let client = reqwest::Client::builder()
            // A store that redirects is misconfigured; following it would sign for another host.
            .redirect(reqwest::redirect::Policy::none())
            .connect_timeout(Duration::from_secs(5))
            // No overall timeout: a recording may be a GiB. A stalled transfer still ends.
            .read_timeout(Duration::from_secs(60))
            .build()
            .map_err(|e| object_store::Error::Generic {
                store: "S3",
                source: Box::new(e),
            })?;
        Ok(HttpClient::new(Service(client)))
    }
}

#[derive(Debug)]
struct Service(reqwest::Client);

#[async_trait::async_trait]
impl HttpService for Service {
    async fn call(&self, req: HttpRequest) -> Result<HttpResponse, HttpError> {
        let (parts, body) = req.into_parts();
        let url = reqwest::Url::parse(&parts.uri.to_string())
            .map_err(|e| HttpError::new(HttpErrorKind::Request, e))?;
        let mut request = reqwest::Request::new(parts.method, url);
        *request.headers_mut() = parts.headers;
        // Streamed as object_store holds it (a multipart part is a list of buffers).
        *request.body_mut() = Some(reqwest::Body::wrap(body));
        let response = self.0.execute(request).await.map_err(error)?;
        let response: http::Response<reqwest::Body> = response.into();
        let (parts, body) = response.into_parts();
        let body = HttpResponseBody::new(body.map_err(error));
        Ok(HttpResponse::from_parts(parts, body))
    }
}

/// reqwest's error as object_store's, of the kind its retries go by.
fn error(e: reqwest::Error) -> HttpError {
    let kind = if e.is_timeout() {
        HttpErrorKind::Timeout
    } else if e.is_connect() {
        HttpErrorKind::Connect
    } else if e.is_decode() {
        HttpErrorKind::Decode
    } else if e.is_body() {
        HttpErrorKind::Interrupted
    } else if e.is_request() {
        HttpErrorKind::Request
    } else {
        HttpErrorKind::Unknown
    };
    // reqwest's message stops at "error sending request"; the reason (connection refused, a
    // certificate) is in its sources.
    let mut said = e.to_string();
    let mut source = std::error::Error::source(&e);
    while let Some(s) = source {
        said = format!("{said}: {s}");
        source = s.source();
    }
    HttpError::new(kind, std::io::Error::other(said))
}
