//! A model API's base URL as the model route keeps it: ending in exactly one `/v1`, whether
//! the operator wrote `https://api.example.com`, `…/v1/` or `…//v1//` (Dreadnode normalises
//! `DREADNODE_LLM_BASE` the same way). Its own module: the flags, `paddock tenant set` and the
//! tenants file all check a base with it.

use axum::http::Uri;

/// `https://api.example.com`, `…/v1`, `…/v1/` and `…//v1//` all become `…/v1`.
pub fn normalise_base(url: &str) -> Result<String, String> {
    let uri: Uri = url.trim().parse().map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    match uri.scheme_str() {
        Some("http" | "https") => {}
        _ => return Err(format!("{url:?}: give an http:// or https:// URL")),
    }
    if uri.query().is_some() {
        return Err(format!("{url:?}: a base URL has no query"));
    }
    let mut path = uri.path().trim_end_matches('/').to_owned();
    while let Some(p) = path.strip_suffix("/v1") {
        path = p.trim_end_matches('/').to_owned();
    }
    let authority = uri.authority().ok_or_else(|| format!("{url:?} names no host"))?;
    Ok(format!("{}://{authority}{path}/v1", uri.scheme_str().unwrap_or("https")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bases_are_normalised_to_one_v1() {
        for (given, want) in [
            ("https://api.example.com", "https://api.example.com/v1"),
            ("https://api.example.com/v1", "https://api.example.com/v1"),
            ("https://api.example.com/v1/", "https://api.example.com/v1"),
            ("http://127.0.0.1:9000//v1//", "http://127.0.0.1:9000/v1"),
            ("https://gw.example/openai/v1/v1", "https://gw.example/openai/v1"),
            ("https://gw.example/openai", "https://gw.example/openai/v1"),
        ] {
            assert_eq!(normalise_base(given).as_deref(), Ok(want), "{given}");
        }
        for bad in ["api.example.com", "ftp://x/v1", "https://x/v1?k=1", ""] {
            assert!(normalise_base(bad).is_err(), "{bad}");
        }
    }
}
