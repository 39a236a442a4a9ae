//! A plain HTTP/1.0 GET, for the health and metrics endpoints of the cluster's components and
//! of the pods tests run: no TLS, no client library.

use std::net::IpAddr;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// `GET path` from `ip:port`; the status code and the body.
///
/// # Errors
/// The connection or read error, or an answer that is not HTTP, as text.
pub async fn get(ip: IpAddr, port: u16, path: &str) -> Result<(u16, String), String> {
    let mut stream = tokio::net::TcpStream::connect((ip, port))
        .await
        .map_err(|e| format!("connecting to {ip}:{port}: {e}"))?;
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: {ip}\r\n\r\n").as_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut response = String::new();
    stream
        .read_to_string(&mut response)
        .await
        .map_err(|e| e.to_string())?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .unwrap_or((response.as_str(), ""));
    let status = head
        .lines()
        .next()
        .and_then(|line| line.split_whitespace().nth(1))
        .and_then(|code| code.parse().ok())
        .ok_or_else(|| format!("GET {path} from {ip}:{port}: not an HTTP answer: {head:?}"))?;
    Ok((status, body.to_owned()))
}

/// `GET path` from `ip:port`, which must answer 200; the body.
///
/// # Errors
/// As [`get`], or the status and body of any other answer.
pub async fn get_ok(ip: IpAddr, port: u16, path: &str) -> Result<String, String> {
    match get(ip, port, path).await? {
        (200, body) => Ok(body),
        (status, body) => Err(format!("GET {path} answered {status}: {}", body.trim())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    #[tokio::test]
    async fn reads_status_and_body() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let port = listener.local_addr().expect("address").port();
        let server = tokio::spawn(async move {
            for answer in ["HTTP/1.1 200 OK\r\n\r\nfine", "HTTP/1.1 503 No\r\n\r\nbusy"] {
                let (mut socket, _) = listener.accept().await.expect("accept");
                let mut request = [0_u8; 256];
                let _ = socket.read(&mut request).await;
                socket.write_all(answer.as_bytes()).await.expect("write");
            }
        });
        let loopback = IpAddr::V4(Ipv4Addr::LOCALHOST);
        assert_eq!(get_ok(loopback, port, "/a").await, Ok("fine".to_owned()));
        let error = get_ok(loopback, port, "/b").await.expect_err("503");
        assert!(error.contains("503") && error.contains("busy"), "{error}");
        server.await.expect("server");
    }
}
