//! `paddock serve` as a child process, driven over HTTP, for the tests that need the real server.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

pub const KEY: &str = "test-key-0123456789";

pub struct Server {
    pub child: Child,
    pub port: u16,
    pub agent: ureq::Agent,
    pub key: String,
}

/// `paddock serve` on the data directory and port, with these arguments (after `--listen`)
/// and environment; stdout to /dev/null.
pub fn serve_command(data: &std::path::Path, port: u16, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut command = Command::new(super::EXE);
    command
        .args(["--data-dir", data.to_str().unwrap(), "serve", "--listen", &format!("127.0.0.1:{port}")])
        .args(args)
        .envs(env.iter().copied())
        .env("PADDOCK_LOG", "warn")
        .stdout(Stdio::null());
    command
}

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

impl Server {
    pub fn start(data: &std::path::Path, extra: &[&str]) -> Server {
        Self::launch(data, &[&["--api-key", KEY], extra].concat(), &[])
    }

    /// Starts `paddock serve` with exactly these arguments (after `--listen`) and environment;
    /// the key it then uses is the one given, or the one the server stored.
    pub fn launch(data: &std::path::Path, args: &[&str], env: &[(&str, &str)]) -> Server {
        super::require_root();
        let port = free_port();
        let child = serve_command(data, port, args, env).stderr(Stdio::null()).spawn().unwrap();
        let agent: ureq::Agent = ureq::Agent::config_builder().http_status_as_error(false).build().into();
        let mut s = Server { child, port, agent, key: KEY.to_owned() };
        let deadline = Instant::now() + Duration::from_secs(20);
        while s.agent.get(&s.url("/health")).call().is_err() {
            assert!(Instant::now() < deadline, "the server did not come up");
            std::thread::sleep(Duration::from_millis(50));
        }
        if !args.contains(&"--api-key") {
            s.key = std::fs::read_to_string(data.join("api-key")).unwrap_or_default().trim().to_owned();
        }
        s
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn call(&self, method: &str, path: &str, body: Option<&Value>, headers: &[(&str, &str)]) -> (u16, Value) {
        let mut req = ureq::http::Request::builder().method(method).uri(self.url(path));
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let resp = match body {
            Some(b) => self.agent.run(req.header("content-type", "application/json").body(b.to_string()).unwrap()),
            None => self.agent.run(req.body(()).unwrap()),
        }
        .unwrap();
        let status = resp.status().as_u16();
        let text = resp.into_body().read_to_string().unwrap_or_default();
        (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
    }

    pub fn api(&self, method: &str, path: &str, body: Option<&Value>) -> (u16, Value) {
        self.call(method, path, body, &[("OPEN-SANDBOX-API-KEY", &self.key)])
    }

    pub fn create(&self) -> String {
        let (status, body) =
            self.api("POST", "/v1/sandboxes", Some(&json!({"image": {"uri": "host"}, "timeout": 600})));
        assert_eq!(status, 202, "{body}");
        body["id"].as_str().unwrap().to_owned()
    }

    /// Runs a command through the execd API and returns (stdout lines, exit code).
    pub fn run(&self, id: &str, command: &str, background: bool) -> (Vec<String>, i64) {
        let req = ureq::http::Request::builder()
            .method("POST")
            .uri(self.url(&format!("/v1/sandboxes/{id}/proxy/44772/command")))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .header("content-type", "application/json")
            .body(json!({"command": command, "background": background}).to_string())
            .unwrap();
        let resp = self.agent.run(req).unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let mut lines = Vec::new();
        let mut code = -1;
        for line in BufReader::new(resp.into_body().into_reader()).lines() {
            let line = line.unwrap();
            let Some(data) = line.strip_prefix("data: ").or_else(|| line.strip_prefix('{').map(|_| line.as_str()))
            else {
                continue;
            };
            let event: Value = serde_json::from_str(data).unwrap();
            match event["type"].as_str() {
                Some("stdout") => lines.push(event["text"].as_str().unwrap().to_owned()),
                Some("execution_complete") => code = 0,
                Some("error") => code = event["error"]["evalue"].as_str().unwrap().parse().unwrap(),
                _ => {}
            }
        }
        (lines, code)
    }

    pub fn kill9(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A server the test killed has nothing to clean up through.
        if self.child.try_wait().is_ok_and(|s| s.is_some()) {
            return;
        }
        if let Ok((200, list)) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            self.api("GET", "/v1/sandboxes?pageSize=200", None)
        })) {
            for item in list["items"].as_array().cloned().unwrap_or_default() {
                let _ = self.api("DELETE", &format!("/v1/sandboxes/{}", item["id"].as_str().unwrap_or("")), None);
            }
        }
        self.kill9();
    }
}

pub fn data_dir() -> tempfile::TempDir {
    tempfile::Builder::new().prefix("pds").tempdir_in("/tmp").unwrap()
}
