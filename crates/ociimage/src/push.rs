//! Pushing an archive written by [`crate::Image::write`] to a registry that speaks plain HTTP,
//! through the OCI distribution API: each blob the registry lacks is uploaded in one `PUT`, then
//! the manifest is put under its tag.
//!
//! Plain HTTP only, without authentication: this is for a registry on the machine or its private
//! network (a local cluster's). For a registry with TLS and credentials, copy the archive with
//! `skopeo copy oci-archive:<archive> docker://<name>`.

use std::collections::HashMap;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use crate::Error;
use crate::layout::{MEDIA_TYPE_MANIFEST, blob_path};

/// How long one request may wait for the registry to accept, answer or take a blob.
const TIMEOUT: Duration = Duration::from_secs(120);

/// What a push did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pushed {
    /// Where the image is now, `host:port/repository:tag`.
    pub name: String,
    /// The manifest's digest, as the registry confirmed it.
    pub manifest_digest: String,
    /// Blobs uploaded.
    pub uploaded: usize,
    /// Blobs the registry already had.
    pub present: usize,
}

#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Manifest {
    #[serde(rename = "mediaType")]
    media_type: String,
    config: Descriptor,
    layers: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
}

/// Pushes the image in `archive` to `registry` (`host:port`) as `repository:tag`.
///
/// # Errors
/// [`Error::Write`] when the archive cannot be read, [`Error::BadArchive`] when it is not an OCI
/// layout with one manifest, and [`Error::Push`] naming the step the registry refused or the
/// connection that failed.
pub fn push(archive: &Path, registry: &str, repository: &str, tag: &str) -> Result<Pushed, Error> {
    let files = read_archive(archive)?;
    let bad = |reason: String| Error::BadArchive {
        archive: archive.to_owned(),
        reason,
    };
    let file = |name: &str| {
        files
            .get(name)
            .ok_or_else(|| bad(format!("it holds no {name}")))
    };
    let index: Index =
        serde_json::from_slice(file("index.json")?).map_err(|e| bad(format!("index.json: {e}")))?;
    let [manifest_descriptor] = index.manifests.as_slice() else {
        return Err(bad(format!(
            "index.json lists {} manifests, not one",
            index.manifests.len()
        )));
    };
    let manifest_bytes = file(&blob_path(&manifest_descriptor.digest))?;
    let manifest: Manifest =
        serde_json::from_slice(manifest_bytes).map_err(|e| bad(format!("the manifest: {e}")))?;

    let client = Client { registry };
    let (mut uploaded, mut present) = (0, 0);
    for blob in std::iter::once(&manifest.config).chain(&manifest.layers) {
        let data = file(&blob_path(&blob.digest))?;
        if client.has_blob(repository, &blob.digest)? {
            present += 1;
        } else {
            client.upload_blob(repository, &blob.digest, data)?;
            uploaded += 1;
        }
    }
    let manifest_digest =
        client.put_manifest(repository, tag, &manifest.media_type, manifest_bytes)?;
    if manifest_digest != manifest_descriptor.digest {
        return Err(client.refused(
            "putting the manifest",
            format!(
                "it stored {manifest_digest}, and the archive's manifest is {}",
                manifest_descriptor.digest
            ),
        ));
    }
    Ok(Pushed {
        name: format!("{registry}/{repository}:{tag}"),
        manifest_digest,
        uploaded,
        present,
    })
}

/// The digest of the manifest `registry` holds as `repository:tag`, `None` when it holds none.
///
/// # Errors
/// [`Error::Push`] when the registry cannot be reached or answers otherwise.
pub fn manifest_digest(
    registry: &str,
    repository: &str,
    tag: &str,
) -> Result<Option<String>, Error> {
    let client = Client { registry };
    let path = format!("/v2/{repository}/manifests/{tag}");
    // A registry answers for an OCI manifest only to a client that says it reads one.
    let answer = client.request("HEAD", &path, None, Some(MEDIA_TYPE_MANIFEST))?;
    match (answer.status, answer.header("Docker-Content-Digest")) {
        (200, Some(digest)) => Ok(Some(digest.to_owned())),
        (404, _) => Ok(None),
        _ => Err(client.refused(&format!("asking for {repository}:{tag}"), answer)),
    }
}

/// The archive's files by path: the layout's `index.json` and its blobs.
fn read_archive(archive: &Path) -> Result<HashMap<String, Vec<u8>>, Error> {
    let read_error = |source| Error::Write {
        action: "read",
        path: archive.to_owned(),
        source,
    };
    let file = std::fs::File::open(archive).map_err(read_error)?;
    let mut tar = tar::Archive::new(file);
    let mut files = HashMap::new();
    for entry in tar.entries().map_err(read_error)? {
        let mut entry = entry.map_err(read_error)?;
        let path = entry.path().map_err(read_error)?.display().to_string();
        if path == "index.json" || path.starts_with("blobs/") {
            let mut data = Vec::new();
            entry.read_to_end(&mut data).map_err(read_error)?;
            files.insert(path, data);
        }
    }
    Ok(files)
}

/// A registry's API over plain HTTP/1.0: one connection per request, closed by the registry.
struct Client<'a> {
    registry: &'a str,
}

/// A registry's answer.
struct Answer {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(key, _)| key.eq_ignore_ascii_case(name))
            .map(|(_, value)| value.as_str())
    }
}

impl Client<'_> {
    fn has_blob(&self, repository: &str, digest: &str) -> Result<bool, Error> {
        let path = format!("/v2/{repository}/blobs/{digest}");
        let answer = self.request("HEAD", &path, None, None)?;
        match answer.status {
            200 => Ok(true),
            404 => Ok(false),
            _ => Err(self.refused(&format!("asking for blob {digest}"), answer)),
        }
    }

    fn upload_blob(&self, repository: &str, digest: &str, data: &[u8]) -> Result<(), Error> {
        let step = format!("uploading blob {digest}");
        let path = format!("/v2/{repository}/blobs/uploads/");
        let answer = self.request("POST", &path, None, None)?;
        let location = match (answer.status, answer.header("Location")) {
            (202, Some(location)) => location.to_owned(),
            _ => return Err(self.refused(&step, answer)),
        };
        // The location may be a whole URL; this client only needs its path and query.
        let location = match location.split_once("://") {
            Some((_, rest)) => rest.find('/').map_or("/", |at| &rest[at..]).to_owned(),
            None => location,
        };
        let separator = if location.contains('?') { '&' } else { '?' };
        let target = format!("{location}{separator}digest={digest}");
        let answer = self.request(
            "PUT",
            &target,
            Some(("application/octet-stream", data)),
            None,
        )?;
        match answer.status {
            201 => Ok(()),
            _ => Err(self.refused(&step, answer)),
        }
    }

    /// Puts the manifest under `tag`; returns the digest the registry says it stored.
    fn put_manifest(
        &self,
        repository: &str,
        tag: &str,
        media_type: &str,
        manifest: &[u8],
    ) -> Result<String, Error> {
        let path = format!("/v2/{repository}/manifests/{tag}");
        let answer = self.request("PUT", &path, Some((media_type, manifest)), None)?;
        match (answer.status, answer.header("Docker-Content-Digest")) {
            (201, Some(digest)) => Ok(digest.to_owned()),
            (201, None) => Ok(crate::layout::digest(manifest)),
            _ => Err(self.refused(&format!("putting the manifest as {tag}"), answer)),
        }
    }

    fn request(
        &self,
        method: &str,
        path: &str,
        body: Option<(&str, &[u8])>,
        accept: Option<&str>,
    ) -> Result<Answer, Error> {
        let step = format!("{method} {path}");
        let failed = |e: std::io::Error| self.refused(&step, e.to_string());
        let mut stream = TcpStream::connect(self.registry).map_err(failed)?;
        stream.set_read_timeout(Some(TIMEOUT)).map_err(failed)?;
        stream.set_write_timeout(Some(TIMEOUT)).map_err(failed)?;
        let mut head = format!("{method} {path} HTTP/1.0\r\nHost: {}\r\n", self.registry);
        if let Some(accept) = accept {
            head.push_str(&format!("Accept: {accept}\r\n"));
        }
        let body = match body {
            Some((content_type, data)) => {
                head.push_str(&format!("Content-Type: {content_type}\r\n"));
                data
            }
            None => &[],
        };
        head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
        stream.write_all(head.as_bytes()).map_err(failed)?;
        stream.write_all(body).map_err(failed)?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).map_err(failed)?;
        parse_answer(&response).ok_or_else(|| {
            self.refused(
                &step,
                format!(
                    "not an HTTP answer: {:?}",
                    String::from_utf8_lossy(&response[..response.len().min(200)])
                ),
            )
        })
    }

    fn refused(&self, step: &str, why: impl Into<Refusal>) -> Error {
        Error::Push {
            registry: self.registry.to_owned(),
            step: step.to_owned(),
            message: why.into().0,
        }
    }
}

/// What went wrong with a request, as text.
struct Refusal(String);

impl From<String> for Refusal {
    fn from(message: String) -> Self {
        Self(message)
    }
}

impl From<Answer> for Refusal {
    fn from(answer: Answer) -> Self {
        let body = answer.body.trim();
        Self(if body.is_empty() {
            format!("HTTP {}", answer.status)
        } else {
            format!("HTTP {}: {body}", answer.status)
        })
    }
}

/// The status, headers and body of an HTTP/1.x answer, `None` when it is not one.
fn parse_answer(response: &[u8]) -> Option<Answer> {
    let text = String::from_utf8_lossy(response);
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    let mut lines = head.lines();
    let status_line = lines.next()?;
    if !status_line.starts_with("HTTP/1.") {
        return None;
    }
    let status = status_line.split_whitespace().nth(1)?.parse().ok()?;
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(name, value)| (name.trim().to_owned(), value.trim().to_owned()))
        .collect();
    Some(Answer {
        status,
        headers,
        body: body.to_owned(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_read_with_their_headers_and_body() {
        let answer = parse_answer(
            b"HTTP/1.0 202 Accepted\r\nLocation: /v2/x/blobs/uploads/u?_state=s\r\n\
              Content-Length: 0\r\n\r\n",
        )
        .expect("an answer");
        assert_eq!(answer.status, 202);
        assert_eq!(
            answer.header("location"),
            Some("/v2/x/blobs/uploads/u?_state=s")
        );
        assert!(parse_answer(b"SSH-2.0-OpenSSH\r\n").is_none());
    }

    #[test]
    fn a_refusal_names_the_status_and_what_the_registry_said() {
        let answer = parse_answer(
            b"HTTP/1.0 400 Bad Request\r\n\r\n{\"errors\":[{\"code\":\"DIGEST_INVALID\"}]}",
        )
        .expect("an answer");
        let Refusal(text) = answer.into();
        assert_eq!(
            text,
            "HTTP 400: {\"errors\":[{\"code\":\"DIGEST_INVALID\"}]}"
        );
    }
}
