//! Image references with Docker Hub's rules for short names.

use crate::error::{ImageError, Result};

pub(crate) const DOCKER_HUB: &str = "docker.io";

/// A parsed, normalized reference: always a registry, a full repository, and a tag or a digest
/// (a digest wins over a tag given with it, as Docker does: the digest names the content).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Ref {
    pub registry: String,
    pub repository: String,
    pub tag: Option<String>,
    pub digest: Option<String>,
}

impl Ref {
    pub fn parse(reference: &str) -> Result<Ref> {
        let bad = |why: &str| ImageError::InvalidReference(format!("{reference:?}: {why}"));
        let reference_trim = reference.trim();
        if reference_trim.is_empty() {
            return Err(bad("it is empty; give a name such as python:3.11"));
        }
        if reference_trim.len() > 512 {
            return Err(bad("it is longer than 512 characters"));
        }
        let (name, digest) = match reference_trim.split_once('@') {
            Some((n, d)) => (n, Some(parse_digest(d).map_err(|why| bad(&why))?)),
            None => (reference_trim, None),
        };
        // A ':' after the last '/' starts the tag; one before it belongs to a registry port.
        let slash = name.rfind('/').map_or(0, |i| i + 1);
        let (name, tag) = match name[slash..].find(':') {
            Some(i) => (&name[..slash + i], Some(&name[slash + i + 1..])),
            None => (name, None),
        };
        if let Some(t) = tag {
            let ok = !t.is_empty()
                && t.len() <= 128
                && t.chars().next().is_some_and(|c| c.is_ascii_alphanumeric() || c == '_')
                && t.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
            if !ok {
                return Err(bad("a tag is 1 to 128 letters, digits, '_', '.' or '-', not starting with '.' or '-'"));
            }
        }
        let (registry, path) = match name.split_once('/') {
            Some((first, rest)) if first.contains('.') || first.contains(':') || first == "localhost" => {
                (first.to_string(), rest.to_string())
            }
            _ => (DOCKER_HUB.to_string(), name.to_string()),
        };
        let registry = match registry.as_str() {
            "index.docker.io" | "registry-1.docker.io" => DOCKER_HUB.to_string(),
            _ => registry,
        };
        if registry.chars().any(|c| !(c.is_ascii_alphanumeric() || ".-:[]".contains(c))) {
            return Err(bad("the registry host has characters a host name cannot have"));
        }
        if path.is_empty() {
            return Err(bad("the repository name is missing"));
        }
        for component in path.split('/') {
            let ok = !component.is_empty()
                && component.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
                && component.starts_with(|c: char| c.is_ascii_alphanumeric())
                && component.ends_with(|c: char| c.is_ascii_alphanumeric());
            if !ok {
                return Err(bad(
                    "repository names are lowercase letters, digits and '.', '_', '-' between them, separated by '/'",
                ));
            }
        }
        let repository = if registry == DOCKER_HUB && !path.contains('/') { format!("library/{path}") } else { path };
        let tag = match (&digest, tag) {
            (Some(_), _) => None,
            (None, Some(t)) => Some(t.to_string()),
            (None, None) => Some("latest".to_string()),
        };
        Ok(Ref { registry, repository, tag, digest })
    }

    /// Registry and repository without tag or digest.
    pub fn repo_name(&self) -> String {
        format!("{}/{}", self.registry, self.repository)
    }
}

impl std::fmt::Display for Ref {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.registry, self.repository)?;
        if let Some(d) = &self.digest {
            write!(f, "@{d}")
        } else {
            write!(f, ":{}", self.tag.as_deref().unwrap_or("latest"))
        }
    }
}

/// `sha256:<64 lowercase hex>`; other algorithms exist in the spec but no registry serves them.
pub(crate) fn parse_digest(d: &str) -> std::result::Result<String, String> {
    let Some(hex) = d.strip_prefix("sha256:") else {
        return Err(format!("digest {d:?} is not sha256:<64 hex digits> (the only algorithm supported)"));
    };
    if hex.len() != 64 || !hex.chars().all(|c| c.is_ascii_digit() || ('a'..='f').contains(&c)) {
        return Err(format!("digest {d:?} is not sha256:<64 lowercase hex digits>"));
    }
    Ok(d.to_string())
}

/// The normalized form of `reference` (Docker Hub rules): `python` is
/// `docker.io/library/python:latest`, `user/img` is `docker.io/user/img:latest`, and a first
/// component with a `.` or `:`, or `localhost`, is a registry host.
pub fn normalize(reference: &str) -> Result<String> {
    Ok(Ref::parse(reference)?.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const D: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

    #[test]
    fn docker_hub_short_names() {
        assert_eq!(normalize("python").unwrap(), "docker.io/library/python:latest");
        assert_eq!(normalize("python:3.11").unwrap(), "docker.io/library/python:3.11");
        assert_eq!(normalize("user/img").unwrap(), "docker.io/user/img:latest");
        assert_eq!(normalize("docker.io/library/python:3.11").unwrap(), "docker.io/library/python:3.11");
        assert_eq!(normalize("docker.io/python").unwrap(), "docker.io/library/python:latest");
        assert_eq!(normalize("index.docker.io/library/python").unwrap(), "docker.io/library/python:latest");
    }

    #[test]
    fn registries_ports_and_digests() {
        assert_eq!(normalize("127.0.0.1:5000/x/y:tag").unwrap(), "127.0.0.1:5000/x/y:tag");
        assert_eq!(normalize("localhost/a").unwrap(), "localhost/a:latest");
        assert_eq!(normalize("localhost:5000/a").unwrap(), "localhost:5000/a:latest");
        assert_eq!(normalize("registry.example.com/team/img").unwrap(), "registry.example.com/team/img:latest");
        assert_eq!(normalize(&format!("python@{D}")).unwrap(), format!("docker.io/library/python@{D}"));
        assert_eq!(normalize(&format!("python:3.11@{D}")).unwrap(), format!("docker.io/library/python@{D}"));
        assert_eq!(normalize(&format!("127.0.0.1:5000/x@{D}")).unwrap(), format!("127.0.0.1:5000/x@{D}"));
        // Without a '.' or ':' the first component is a Docker Hub user, not a host.
        assert_eq!(normalize("myhost/img").unwrap(), "docker.io/myhost/img:latest");
    }

    #[test]
    fn rejects_bad_references() {
        for bad in [
            "",
            "Python",
            "python:",
            "python:-x",
            "python@sha256:abc",
            "python@md5:0123",
            "a//b",
            "a/../b",
            "-a",
            "docker.io/",
            "reg.io/a b",
            &format!("python@sha256:{}", "A".repeat(64)),
        ] {
            assert!(matches!(normalize(bad), Err(ImageError::InvalidReference(_))), "{bad:?} accepted");
        }
    }
}
