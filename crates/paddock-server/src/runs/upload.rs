//! Archives a run takes in (inputs) and gives back (results): kept to a file as they arrive,
//! then checked against the run limits. Shared by the run API and the gateway.

use axum::body::Body;
use axum::http::StatusCode;
use http_body_util::BodyExt;
use sha2::{Digest, Sha256};
use tokio::io::AsyncWriteExt;

use super::{Runs, tarcheck};
use crate::error::{ApiError, ApiResult};

/// Writes a request body to `path`, at most `max` bytes; answers its SHA-256.
pub(super) async fn body_to_file(body: Body, path: &std::path::Path, max: u64) -> ApiResult<Vec<u8>> {
    let mut file = tokio::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(path)
        .await
        .map_err(|e| ApiError::internal(format!("keeping the upload: {e}")))?;
    let mut hasher = Sha256::new();
    let mut total = 0u64;
    let mut body = body;
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| ApiError::bad_request(format!("reading the upload: {e}")))?;
        let Ok(chunk) = frame.into_data() else { continue };
        total += chunk.len() as u64;
        if total > max {
            return Err(ApiError::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "PAYLOAD_TOO_LARGE",
                format!("the archive is larger than {max} bytes, the most a run may upload"),
            ));
        }
        hasher.update(&chunk);
        file.write_all(&chunk).await.map_err(|e| ApiError::internal(format!("keeping the upload: {e}")))?;
    }
    file.flush().await.map_err(|e| ApiError::internal(format!("keeping the upload: {e}")))?;
    Ok(hasher.finalize().to_vec())
}

/// Checks a kept archive against the run limits, off the async threads.
pub(super) async fn check_tar(runs: &Runs, path: std::path::PathBuf) -> ApiResult<usize> {
    let limits = tarcheck::Limits { max_entries: runs.opts.max_tar_entries, max_bytes: runs.opts.max_tar_bytes };
    tokio::task::spawn_blocking(move || {
        #[expect(clippy::disallowed_methods, reason = "inside spawn_blocking")]
        let f = std::fs::File::open(&path).map_err(|e| ApiError::internal(format!("reading the upload: {e}")))?;
        tarcheck::check(std::io::BufReader::new(f), limits)
            .map_err(|e| ApiError::new(StatusCode::BAD_REQUEST, "INVALID_ARCHIVE", e.0))
    })
    .await
    .map_err(|e| ApiError::internal(format!("checking the upload: {e}")))?
}
